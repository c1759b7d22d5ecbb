"""``granite``: Granite 3.2+'s thinking mode writes its reasoning in plain words::

    Here is my thought process: ... Here is my response: ...

("Here's" as well)."""

from __future__ import annotations

from hybridkv.server.reasoning.base import BaseReasoningParser


class GraniteReasoningParser(BaseReasoningParser):
    name = "granite"
    starts = ("Here is my thought process:", "Here's my thought process:")
    ends = ("Here is my response:", "Here's my response:")
