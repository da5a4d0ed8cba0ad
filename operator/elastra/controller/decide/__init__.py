"""Pure decisions of one pass: raw objects in, a ``PassWrites`` out; no API call, no clock read
(the engine passes ``now``), no Kopf.

Some modules here keep memos (``memo.LastOf``, ``memo.PerObject``) keyed by the identity of
the listings the engine hands every pass: they change no answer (the same input gives the
same output, cached or not) and keep a pass's CPU flat as jobs multiply; each module's
docstring says what it memoizes.
"""
