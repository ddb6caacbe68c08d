# Shared by scripts/test-arm64.sh and scripts/test-systemd.sh (sourced; they define `die` and
# SUITE): where to debootstrap from, and removing only root filesystems of our own.

# The first mirror this host's apt uses for the bare suite (deb822 .sources, then .list files).
# detect_mirror [OVERRIDE]: OVERRIDE when given (the caller's environment variable).
detect_mirror() {
    if [[ -n ${1:-} ]]; then echo "$1"; return; fi
    local f uri
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -r $f ]] || continue
        uri=$(awk -v suite="$SUITE" '
            function flush() {
                if (!found && ok && !off && uris != "" && types ~ /(^|[ \t])deb([ \t]|$)/) {
                    split(uris, u, /[ \t]+/); print u[1]; found = 1
                }
                ok = 0; off = 0; uris = ""; types = ""
            }
            /^[ \t]*#/ { next }
            /^[ \t]*$/ { flush(); next }
            { key = tolower($1); val = $0; sub(/^[^:]*:[ \t]*/, "", val) }
            key == "types:" { types = val }
            key == "uris:" { uris = val }
            key == "enabled:" && tolower(val) == "no" { off = 1 }
            key == "suites:" { for (i = 2; i <= NF; i++) if ($i == suite) ok = 1 }
            END { flush() }' "$f")
        if [[ -n $uri ]]; then echo "$uri"; return; fi
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -r $f ]] || continue
        uri=$(awk -v suite="$SUITE" '
            $1 == "deb" {
                i = 2
                if ($i ~ /^\[/) { while (i < NF && $i !~ /\]$/) i++; i++ }
                if ($(i + 1) == suite) { print $i; exit }
            }' "$f")
        if [[ -n $uri ]]; then echo "$uri"; return; fi
    done
    echo http://deb.debian.org/debian
}

# Refuse to delete anything that is not one of our root filesystems.
remove_root() {
    local dir=$1
    [[ -e $dir ]] || return 0
    [[ -f $dir/.edgeinfer-rootfs || -f $dir/.edgeinfer-partial || -z $(ls -A "$dir") ]] ||
        die "$dir exists and is not an edgeinfer root filesystem; refusing to delete it"
    rm -rf --one-file-system "$dir"
}
