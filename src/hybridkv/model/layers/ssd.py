"""Mamba2 state-space recurrences: a chunked scan for prefill, a single step for decode.

Per head h the recurrence is ``S_t = exp(dt_t * A_h) * S_{t-1} + dt_t * x_t B_t^T`` and
``y_t = S_t C_t``. The chunked scan computes the same thing in blocks of ``chunk`` tokens:
quadratic (attention-like) inside a chunk, recurrent between chunks. Decay sums are built with
cumulative sums of masked increments, never by subtracting large prefix sums.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def ssd_chunk_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    init: torch.Tensor,
    chunk: int,
    taps: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """x ``[R, L, h, p]``, dt ``[R, L, h]`` (0 at padding), a ``[h]``, b/c ``[R, L, h, n]``,
    init ``[R, h, p, n]``; all float32. Returns y ``[R, L, h, p]``, the final state, and for
    ``taps = (rows, lens)`` (``[K]`` each) the state of row ``rows[k]`` after ``lens[k]``
    tokens ``[K, h, p, n]`` (None without taps)."""
    length = x.shape[1]
    pad = (-length) % chunk
    x, dt, b, c = (_pad_time(t, pad) for t in (x, dt, b, c))
    x, dt, b, c = (
        t.view(t.shape[0], -1, chunk, *t.shape[2:]) for t in (x, dt, b, c)
    )  # [R, nc, l, ...]
    xdt = x * dt[..., None]  # [R, nc, l, h, p]
    incr = (dt * a).permute(0, 1, 3, 2)  # [R, nc, h, l]
    decay = torch.exp(_segment_sum(incr))  # [R, nc, h, l, l]: exp(sum a over (j, i])
    scores = torch.einsum("rclhn,rcshn->rchls", c, b) * decay  # [R, nc, h, l, l]
    y = torch.einsum("rchls,rcshp->rclhp", scores, xdt)  # [R, nc, l, h, p]
    to_end = decay[..., -1, :]  # [R, nc, h, l]: decay from each token to the chunk's end
    chunk_states = torch.einsum("rclhn,rchl,rclhp->rchpn", b, to_end, xdt)  # [R, nc, h, p, n]
    from_start = torch.exp(torch.cumsum(incr, dim=-1))  # [R, nc, h, l]
    chunk_decay = from_start[..., -1]  # [R, nc, h]
    state = init
    y_off, inits = [], []
    for i in range(x.shape[1]):
        inits.append(state)
        y_i = torch.einsum("rlhn,rhpn->rlhp", c[:, i], state)  # [R, l, h, p]
        y_off.append(y_i * from_start[:, i].transpose(1, 2)[..., None])
        state = state * chunk_decay[:, i, :, None, None] + chunk_states[:, i]
    y = y + torch.stack(y_off, dim=1)  # [R, nc, l, h, p]
    tapped = None
    if taps is not None:
        inits.append(state)
        states = torch.stack(inits, dim=1)  # [R, nc + 1, h, p, n]: entering each chunk, final
        tapped = _states_at(taps, chunk, states, b, decay, xdt, from_start)
    return y.flatten(1, 2)[:, :length], state, tapped


def _states_at(
    taps: tuple[torch.Tensor, torch.Tensor],
    chunk: int,
    states: torch.Tensor,
    b: torch.Tensor,
    decay: torch.Tensor,
    xdt: torch.Tensor,
    from_start: torch.Tensor,
) -> torch.Tensor:
    """The state after ``lens[k]`` tokens of row ``rows[k]``: at a chunk's end it is the state
    entering the next chunk (no work); inside a chunk, the state entering it decayed to the
    token plus the chunk's tokens up to it."""
    rows, lens = taps
    ci, j = (lens - 1) // chunk, (lens - 1) % chunk  # chunk and offset of the last token
    out = states[rows, ci + 1]  # [K, h, p, n]: right for taps at a chunk's end
    inside = torch.nonzero(j != chunk - 1).flatten()
    if inside.numel():
        r, c, o = rows[inside], ci[inside], j[inside]
        part = torch.einsum(
            "klhn,klhp->khpn", b[r, c] * decay[r, c, :, o, :].transpose(1, 2)[..., None], xdt[r, c]
        )
        out[inside] = states[r, c] * from_start[r, c, :, o][..., None, None] + part
    return out


def ssd_step_(
    x: torch.Tensor,
    dt: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    state: torch.Tensor,
) -> torch.Tensor:
    """One token: x ``[R, h, p]``, dt ``[R, h]``, b/c ``[R, h, n]``; updates ``state``
    ``[R, h, p, n]`` in place (two passes over it, no temporary of its size), returns y."""
    state.mul_(torch.exp(dt * a)[..., None, None])
    state.addcmul_((dt[..., None] * x)[..., None], b[:, :, None, :])
    return torch.einsum("rhpn,rhn->rhp", state, c)  # [R, h, p]


def _segment_sum(incr: torch.Tensor) -> torch.Tensor:
    """``[..., l]`` -> ``[..., l, l]`` with ``out[i, j] = sum(incr[j+1 : i+1])``, -inf for j > i."""
    size = incr.shape[-1]
    tiled = incr[..., :, None].expand(*incr.shape, size)  # [..., i, j] = incr[i]
    strict = torch.ones(size, size, dtype=torch.bool, device=incr.device).tril(-1)
    sums = torch.cumsum(tiled.masked_fill(~strict, 0.0), dim=-2)  # sum over k in (j, i]
    causal = torch.ones(size, size, dtype=torch.bool, device=incr.device).tril()
    return sums.masked_fill(~causal, float("-inf"))


def _pad_time(t: torch.Tensor, pad: int) -> torch.Tensor:
    if pad == 0:
        return t
    widths = [0, 0] * (t.dim() - 2) + [0, pad]
    return F.pad(t, widths)
