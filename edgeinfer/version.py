"""The package version, at the bottom layer so any module can name it without importing the
package root (whose lazy names reach up to the pipeline)."""

__version__ = "0.1.0"
