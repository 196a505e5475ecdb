"""Cutting text to a length without hiding that it was cut."""


def clip(text: str, limit: int, *, tail: bool = False) -> str:
    """``text`` cut to ``limit`` characters, with a marker saying how much was cut: its head, or
    its ``tail`` (where a traceback ends with the error itself)."""
    if len(text) <= limit:
        return text
    marker = f"... [{len(text) - limit} chars cut]"
    return f"{marker}\n{text[len(text) - limit :]}" if tail else f"{text[:limit]}\n{marker}"
