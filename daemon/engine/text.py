"""Turning generated token bytes into text: whole UTF-8 characters, stop strings removed."""

from __future__ import annotations

import codecs

__all__ = ["TextStream", "unicode_problem"]


def unicode_problem(text: str, field: str) -> str | None:
    """Why ``text`` cannot be tokenized, naming ``field``, or None when it can: JSON lets a
    client send a lone surrogate (``"\\ud800"``), which is not Unicode text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f"{field} is not valid Unicode: it holds a lone surrogate "
            f"(U+{ord(text[exc.start]):04X}) at character {exc.start}"
        )
    return None


class TextStream:
    """Incremental detokenization with stop-string detection.

    Token pieces arrive as bytes that may split a UTF-8 character; the incremental decoder
    holds partial characters back. Text that could be the beginning of a stop string is held
    back too, so a stop string spanning several tokens is never emitted.
    """

    def __init__(self, stop: list[str]) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = [s for s in stop if s]
        self._held = ""
        self.text = ""
        """Everything emitted so far."""
        self.stopped = False
        """True once a stop string was found."""
        self.stopped_by: str | None = None
        """The stop string that was found (the earliest in the text)."""

    def push(self, piece: bytes) -> str:
        """Add a token's bytes; return the text that may be emitted now."""
        if self.stopped:
            return ""
        self._held += self._decoder.decode(piece)
        if not self._stop:
            return self._emit(len(self._held))
        found = [(at, stop) for stop in self._stop if (at := self._held.find(stop)) >= 0]
        if found:
            cut, self.stopped_by = min(found, key=lambda item: item[0])
            self.stopped = True
            text = self._held[:cut]
            self._held = ""
            self.text += text
            return text
        return self._emit(len(self._held) - self._partial_stop_length())

    def _partial_stop_length(self) -> int:
        """Length of the longest tail of the held text that begins some stop string."""
        held = self._held
        longest = 0
        for stop in self._stop:
            for length in range(min(len(stop) - 1, len(held)), longest, -1):
                if held.endswith(stop[:length]):
                    longest = length
                    break
        return longest

    def _emit(self, upto: int) -> str:
        text, self._held = self._held[:upto], self._held[upto:]
        self.text += text
        return text

    def finish(self) -> str:
        """End of generation: release held text (a dangling partial character becomes U+FFFD)."""
        if self.stopped:
            return ""
        self._held += self._decoder.decode(b"", final=True)
        return self._emit(len(self._held))
