"""The B3 chat trace as tokens: pure standard library, so that hybridkv's benchmark (project
venv) and ``prefix_trace_vllm.py`` (vLLM's venv) feed exactly the same requests.

System prompts of 64, 300, 1,000 and 2,000 tokens, a 600-token few-shot block shared by every
other conversation, conversations interleaved round robin; each turn's prompt is the whole
conversation so far plus a new user message (30-150 tokens), and its reply (20-80 tokens) is
part of the next turn. ``message_ends`` are the token positions where each message ends in the
prompt (the system prompt, the few-shot block, every earlier user message and reply, the new
user message): what ``LLM.chat`` and the chat route pass as checkpoint boundaries.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

SYSTEM_LENS = (64, 300, 1000, 2000)
FEW_SHOT_LEN = 600
VOCAB = 32000


@dataclass(frozen=True)
class Turn:
    conversation: int
    system: int  # index into SYSTEM_LENS
    prompt: list[int]
    reply: list[int]
    message_ends: tuple[int, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "conversation": self.conversation,
            "system": self.system,
            "prompt": self.prompt,
            "reply": self.reply,
            "message_ends": list(self.message_ends),
        }


def make_trace(num_conversations: int, num_turns: int, seed: int = 0) -> list[Turn]:
    """Turns in the order they arrive: turn t of every conversation, then turn t + 1."""
    rng = random.Random(seed)

    def text(n: int) -> list[int]:
        return [rng.randrange(3, VOCAB) for _ in range(n)]

    systems = [text(n) for n in SYSTEM_LENS]
    few_shot = text(FEW_SHOT_LEN)
    histories: list[tuple[int, list[int], list[int]]] = []
    for c in range(num_conversations):
        s = c % len(systems)
        head = systems[s] + (few_shot if c % 2 else [])
        ends = [len(systems[s])] + ([len(head)] if c % 2 else [])
        histories.append((s, head, ends))
    turns = []
    for _ in range(num_turns):
        for c, (s, tokens, ends) in enumerate(histories):
            prompt = tokens + text(rng.randrange(30, 150))
            reply = text(rng.randrange(20, 80))
            turns.append(Turn(c, s, prompt, reply, (*ends, len(prompt))))
            ends.extend([len(prompt), len(prompt) + len(reply)])
            tokens.extend(prompt[len(tokens) :] + reply)
    return turns


def make_resend_trace(seed: int = 0) -> list[Turn]:
    """The re-sent batch: 32 prompts of 16-384 tokens sent twice, then 64 new ones twice
    (B1's workload with caching on, then a larger working set); replies of 8-128 tokens."""
    rng = random.Random(seed)
    turns = []
    for n in (32, 64):
        batch = [[rng.randrange(3, VOCAB) for _ in range(rng.randint(16, 384))] for _ in range(n)]
        replies = [[rng.randrange(3, VOCAB) for _ in range(rng.randint(8, 128))] for _ in batch]
        for _ in range(2):
            turns += [
                Turn(i, 0, p, r, ()) for i, (p, r) in enumerate(zip(batch, replies, strict=True))
            ]
    return turns


def make_agentic_trace(num_tasks: int = 16, num_steps: int = 8, seed: int = 0) -> list[Turn]:
    """Agents on a shared 2,000-token tool preamble: each task (a 50-200-token message) runs
    ``num_steps`` steps, interleaved round robin; a step continues its task's newest branch
    (or, one time in four, an older one: a retry), and its reply (20-80 tokens) plus a tool
    result (30-150) is the next prompt; one step in four is abandoned (never continued)."""
    rng = random.Random(seed)

    def text(n: int) -> list[int]:
        return [rng.randrange(3, VOCAB) for _ in range(n)]

    preamble = text(2000)
    tips: list[list[tuple[list[int], tuple[int, ...]]]] = []
    for _ in range(num_tasks):
        head = preamble + text(rng.randrange(50, 200))
        tips.append([(head, (len(preamble), len(head)))])
    turns = []
    for _ in range(num_steps):
        for t, branches in enumerate(tips):
            prompt, ends = branches[-1] if rng.random() < 0.75 else rng.choice(branches)
            reply = text(rng.randrange(20, 80))
            turns.append(Turn(t, 0, prompt, reply, ends))
            if rng.random() < 0.75:
                nxt = prompt + reply + text(rng.randrange(30, 150))
                branches.append((nxt, (*ends, len(prompt) + len(reply), len(nxt))))
    return turns


def first_sharer_reuse(turns: list[Turn], hits: list[int], block: int) -> dict[int, float]:
    """For each system prompt, the share of its full blocks (of ``block`` tokens) that the
    first turn of its second conversation (its first sharer) did not compute."""
    out: dict[int, float] = {}
    seen: set[int] = set()
    for turn, hit in zip(turns, hits, strict=True):
        if turn.conversation in seen:
            continue
        seen.add(turn.conversation)
        if turn.conversation >= len(SYSTEM_LENS):
            full = SYSTEM_LENS[turn.system] // block * block
            out.setdefault(SYSTEM_LENS[turn.system], min(hit, full) / full)
    return dict(sorted(out.items()))


def ideal_hits(turns: list[Turn], block: int) -> list[int]:
    """Each turn's hit in an unbounded cache that holds every state at every ``block``
    boundary of everything computed before (the earlier prompts and their replies, but the
    last reply token): the most any prefix cache at that granularity can reuse."""
    seen: set[int] = set()
    hits = []
    for turn in turns:
        chain = _chain(turn.prompt, block)
        usable = (len(turn.prompt) - 1) // block
        k = 0
        while k < usable and chain[k] in seen:
            k += 1
        hits.append(k * block)
        seen.update(_chain(turn.prompt + turn.reply[:-1], block))
    return hits


def _chain(tokens: list[int], block: int) -> list[int]:
    """A hash per full block, each covering every token before its end."""
    out, h = [], 0
    for i in range(len(tokens) // block):
        h = hash((h, tuple(tokens[i * block : (i + 1) * block])))
        out.append(h)
    return out
