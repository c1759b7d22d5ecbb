"""The gated delta rule (Gated DeltaNet): a chunked form for prefill, one step for decode.

Per value head, with a decay ``exp(g_t)`` (``g_t <= 0``) and a write strength ``beta_t``::

    S_t = exp(g_t) S_{t-1} + beta_t k_t (v_t - exp(g_t) S_{t-1}^T k_t)^T      S: [dk, dv]
    o_t = S_t^T q_t

The chunked form processes ``chunk`` tokens at a time: inside a chunk the delta-rule updates
are condensed with the UT transform (one unit-lower-triangular solve), between chunks the
state is carried recurrently. A token with ``beta = 0`` and ``g = 0`` (padding) leaves the
state unchanged, so right-padded rows of different lengths run as one batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dim (the FLA / transformers form)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    init: torch.Tensor,
    chunk: int = 64,
    taps: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """q/k ``[R, L, h, dk]`` (normalised, q scaled), v ``[R, L, h, dv]``, g/beta ``[R, L, h]``
    (0 at padding), init ``[R, h, dk, dv]``; float32. Returns o ``[R, L, h, dv]``, the final
    state, and for ``taps = (rows, lens)`` the state of row ``rows[k]`` after ``lens[k]``
    tokens ``[K, h, dk, dv]`` (None without taps)."""
    length = q.shape[1]
    pad = (-length) % chunk
    q, k, v = (F.pad(t, (0, 0, 0, 0, 0, pad)).transpose(1, 2) for t in (q, k, v))  # [R,h,L',d]
    g, beta = (F.pad(t, (0, 0, 0, pad)).transpose(1, 2) for t in (g, beta))  # [R, h, L']
    shape = (*q.shape[:2], -1, chunk)
    q, k, v = (t.reshape(*shape, t.shape[-1]) for t in (q, k, v))  # [R, h, n, c, d]
    g, beta = g.reshape(shape), beta.reshape(shape)  # [R, h, n, c]
    cum = g.cumsum(dim=-1)  # log decay from the chunk start to each token
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    k_beta = k * beta[..., None]
    system = (k_beta @ k.transpose(-1, -2)) * decay  # unit lower triangular below the diagonal
    u = torch.linalg.solve_triangular(system, v * beta[..., None], upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(
        system, k_beta * cum.exp()[..., None], upper=False, unitriangular=True
    )
    inner = (q @ k.transpose(-1, -2)) * decay  # [R, h, n, c, c]
    q_decayed = q * cum.exp()[..., None]
    k_to_end = k * (cum[..., -1:] - cum).exp()[..., None]
    chunk_decay = cum[..., -1].exp()[..., None, None]  # [R, h, n, 1, 1]
    state = init
    out, inits, news = [], [], []
    for i in range(q.shape[2]):
        inits.append(state)
        v_new = u[:, :, i] - w[:, :, i] @ state  # [R, h, c, dv]
        news.append(v_new)
        out.append(q_decayed[:, :, i] @ state + inner[:, :, i] @ v_new)
        state = state * chunk_decay[:, :, i] + k_to_end[:, :, i].transpose(-1, -2) @ v_new
    o = torch.stack(out, dim=2).flatten(2, 3)[:, :, :length]  # [R, h, L, dv]
    tapped = None
    if taps is not None:
        inits.append(state)  # [R, h, nc + 1, dk, dv]: entering each chunk, then the final state
        tapped = _states_at(taps, chunk, cum, k, torch.stack(inits, 2), torch.stack(news, 2))
    return o.transpose(1, 2), state, tapped


def _states_at(
    taps: tuple[torch.Tensor, torch.Tensor],
    chunk: int,
    cum: torch.Tensor,
    k: torch.Tensor,
    inits: torch.Tensor,
    news: torch.Tensor,
) -> torch.Tensor:
    """The state after ``lens[k]`` tokens of row ``rows[k]``: the state entering its chunk,
    decayed to the token, plus the chunk's writes up to it (as ``k_to_end`` does for the
    chunk's end); at a chunk's end, the state entering the next chunk. cum ``[R, h, n, c]``,
    k ``[R, h, n, c, dk]``, inits ``[R, h, n + 1, dk, dv]`` (the final state last),
    news (the chunk's corrected values) ``[R, h, n, c, dv]``."""
    rows, lens = taps
    ci, j = (lens - 1) // chunk, (lens - 1) % chunk
    out = inits[rows, :, ci + 1]  # right for taps at a chunk's end (no work)
    inside = torch.nonzero(j != chunk - 1).flatten()
    if not inside.numel():
        return out
    rows, ci, j = rows[inside], ci[inside], j[inside]
    cum_chunk = cum[rows, :, ci]  # [K, h, c]
    cum_j = cum[rows, :, ci, j]  # [K, h]
    upto = torch.arange(chunk, device=cum.device)[None, :] <= j[:, None]  # [K, c]
    weight = (cum_j[..., None] - cum_chunk).masked_fill(~upto[:, None, :], float("-inf")).exp()
    k_to_j = k[rows, :, ci] * weight[..., None]  # [K, h, c, dk]
    start = inits[rows, :, ci] * cum_j.exp()[..., None, None]  # [K, h, dk, dv]
    out[inside] = start + k_to_j.transpose(-1, -2) @ news[rows, :, ci]
    return out


def gated_delta_step_(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> torch.Tensor:
    """One token per row: q/k ``[R, h, dk]``, v ``[R, h, dv]``, g/beta ``[R, h]``; updates
    ``state`` ``[R, h, dk, dv]`` in place and returns o ``[R, h, dv]``."""
    state.mul_(g.exp()[..., None, None])
    predicted = torch.einsum("rhkv,rhk->rhv", state, k)
    delta = (v - predicted) * beta[..., None]
    state.add_(k[..., :, None] * delta[..., None, :])
    return torch.einsum("rhkv,rhk->rhv", state, q)
