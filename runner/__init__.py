"""The training program torchrun starts (`python -m runner`); imports core only (docs/architecture.md)."""
