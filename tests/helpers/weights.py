"""Stand-ins for the weights path's tests: an engine whose reload does nothing, and a model
folder with a config and a weights file of placeholder bytes."""

from __future__ import annotations


class NullEngine:
    def reload(self, folder: object) -> float:
        return 0.0


def write_tiny(folder):
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"\0" * 100)
