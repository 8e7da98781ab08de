"""Word wrap for text that arrives a few characters at a time (a streamed answer).

``textwrap`` needs the whole paragraph; an answer streams token by token and should appear as
it comes. :class:`StreamWrapper` holds back only the word being written: when a word would
cross the right edge, a line break goes before it instead of the terminal cutting it in two.
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
        self._soft_break = False
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
                out.append(self._take_word() + "\n")
                self._column = 0
                self._soft_break = False
            elif char in " \t":
                out.append(self._take_word())
                if self._soft_break and self._column == 0:
                    continue  # the space a wrapped line broke at is not carried over
                if self._column + 1 > self._width:
                    out.append("\n")
                    self._column = 0
                    self._soft_break = True
                else:
                    out.append(char)
                    self._column += 1
            else:
                self._word += char
        self._write("".join(out))

    def _take_word(self) -> str:
        """The held-back word, with a line break before it when it does not fit."""
        word, self._word = self._word, ""
        if not word:
            return ""
        assert self._width is not None
        size = self._cells(word)
        prefix = ""
        if self._column > 0 and self._column + size > self._width:
            prefix = "\n"
            self._column = 0
        self._soft_break = False
        self._column += size
        if self._column > self._width:
            self._column %= self._width  # a word wider than the line: the terminal wrapped it
        return prefix + word

    def flush(self) -> None:
        """Write the word held back, if any."""
        if self._width is not None:
            self._write(self._take_word())

    @property
    def column(self) -> int:
        """The cursor's column after what was written so far (0 at a line start)."""
        return self._column
