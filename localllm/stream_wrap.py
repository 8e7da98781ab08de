"""Word wrap for text that arrives a few characters at a time (a streamed answer).

``textwrap`` needs the whole paragraph; an answer streams token by token and should appear as
it comes. :class:`StreamWrapper` holds back only the word being written (and the spaces before
it): when a word would cross the right edge, a line break replaces those spaces instead of the
terminal cutting the word in two.
Widths are terminal cells (wide CJK characters count two), measured with ``rich``.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["StreamWrapper"]


class StreamWrapper:
    """Wraps streamed text at ``width`` cells and passes it to ``write``.

    ``width`` ``None`` or below 2 turns wrapping off (text passes through unchanged).
    Call :meth:`flush` at the end of the stream for the last word.
    """

    def __init__(self, write: Callable[[str], object], width: int | None) -> None:
        self._write = write
        self._width = width if width is not None and width >= 2 else None
        self._column = 0
        self._word = ""
        self._spaces = ""
        from rich.cells import cell_len

        self._cells = cell_len

    def feed(self, text: str) -> None:
        """Take the next piece of the stream."""
        if self._width is None:
            self._write(text)
            return
        out: list[str] = []
        for char in text:
            if char == "\n":
                out.append(self._take_word() + self._spaces + "\n")
                self._spaces = ""
                self._column = 0
            elif char in " \t":
                if self._word:
                    out.append(self._take_word())
                self._spaces += char
            else:
                self._word += char
        self._write("".join(out))

    def _take_word(self) -> str:
        """The held-back spaces and word; a line break replaces the spaces when the word
        does not fit on the line."""
        assert self._width is not None
        word, spaces = self._word, self._spaces
        self._word = self._spaces = ""
        size, gap = self._cells(word), self._cells(spaces)
        if word and self._column > 0 and self._column + gap + size > self._width:
            self._column = size
            text = "\n" + word
        else:
            self._column += gap + size
            text = spaces + word
        if self._column > self._width:
            self._column %= self._width  # a word wider than the line: the terminal wrapped it
        return text

    def flush(self) -> None:
        """Write what is held back, if anything."""
        if self._width is not None:
            self._write(self._take_word())

    @property
    def column(self) -> int:
        """The cursor's column after what was written so far (0 at a line start)."""
        return self._column
