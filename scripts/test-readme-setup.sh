#!/usr/bin/env bash
# The README's two set-up commands, word for word, from a fresh clone in a fresh virtualenv.
#
# The commands are read from README.md (the two ```sh blocks under "## Two commands"), never
# written here, so they cannot drift. This checkout's committed HEAD is cloned into a temporary
# folder, a virtualenv made with $PYTHON (default python3), and each command run there with
# `bash -euo pipefail`, as a user would paste it.
#
# The second command runs the test suite. PYTEST_ADDOPTS limits it (pytest reads it), by default
# to a quick subset (the README's own examples, model-name resolution and the demo config);
# `PYTEST_ADDOPTS= scripts/test-readme-setup.sh` (set but empty) runs the whole suite.
#
# Usage: scripts/test-readme-setup.sh        (needs network for pip, git, python3 -m venv)
set -euo pipefail

root=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
python=${PYTHON:-python3}
export PYTEST_ADDOPTS="${PYTEST_ADDOPTS-tests/test_readme.py tests/test_catalog.py tests/test_demo_config.py}"

work=$(mktemp -d -t edgeinfer-readme-setup.XXXXXX)
trap 'rm -rf "$work"' EXIT

mapfile -t commands < <("$python" - "$root/README.md" <<'EOF'
import re, sys
text = open(sys.argv[1], encoding="utf-8").read()
section = text.split("\n## Two commands\n", 1)[1].split("\n## ", 1)[0]
blocks = re.findall(r"^```sh\n(.*?)^```$", section, re.M | re.S)
if len(blocks) != 2 or any(b.count("\n") != 1 for b in blocks):
    sys.exit(f"README.md: expected two one-line sh blocks under '## Two commands', got {blocks!r}")
for b in blocks:
    print(b.strip())
EOF
)

git clone -q --no-hardlinks "$root" "$work/edgeinfer"
"$python" -m venv "$work/venv"
# A clean environment as a new user has it: this virtualenv only, no edgeinfer overrides.
unset VIRTUAL_ENV PYTHONPATH PYTHONHOME
for var in $(compgen -e | grep '^EDGEINFER_' || true); do unset "$var"; done
export PATH="$work/venv/bin:$PATH"

cd "$work/edgeinfer"
for cmd in "${commands[@]}"; do
    echo "+ $cmd" >&2
    start=$SECONDS
    if ! bash -euo pipefail -c "$cmd"; then
        echo "test-readme-setup: FAILED: $cmd" >&2
        exit 1
    fi
    echo "test-readme-setup: ok in $((SECONDS - start)) s: $cmd" >&2
done
# Whatever the commands wrote in the clone (results.jsonl) goes with it; git status shows it.
git status --short >&2
echo "test-readme-setup: both README set-up commands passed (PYTEST_ADDOPTS=${PYTEST_ADDOPTS})" >&2
