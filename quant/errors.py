"""InferError: the root of every error infer reports to its user as one line.

It lives here, in the lowest layer (quant imports no other part of infer), so that every layer
above can derive its errors from it: the CLI's `reported()` and the server's error responses catch
InferError (and OSError) rather than a hand-kept list of classes. A subclass also keeps the builtin
base it had (ValueError, RuntimeError), so code that catches those keeps working.
"""
from __future__ import annotations


class InferError(Exception):
    """An expected failure caused by the user's input, files or settings, with a message fit to show.

    `field`, where known, names the request field or option at fault (`temperature`, `stop`), so an
    API can report it without parsing the message.
    """

    def __init__(self, *args: object, field: str | None = None) -> None:
        super().__init__(*args)
        self.field = field
