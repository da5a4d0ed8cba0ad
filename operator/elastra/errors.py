"""Errors that reach the user as one clear line instead of a traceback.

A ``UserError`` means the input was wrong (a file, a field, a node); its message says which
and what would be right. The CLI prints it and exits 2; the controller turns it into a
condition and an Event. Everything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user: the message names what is wrong and what is allowed."""
