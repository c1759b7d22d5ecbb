"""The short causal depthwise convolution in front of Mamba2 and Gated DeltaNet, on state
slots holding each sequence's last ``kernel - 1`` inputs (``[slots, channels, kernel - 1]``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hybridkv.model.layers.step_context import StateTaps


def conv_step_(
    x: torch.Tensor, conv_state: torch.Tensor, live: torch.Tensor | slice, conv1d: nn.Conv1d
) -> torch.Tensor:
    """One input per row ``[R, C]`` -> conv output ``[R, C]`` (no activation); the rows'
    slots ``live`` (a slice is updated through a view) shift in the new input."""
    window = torch.cat([conv_state[live], x[:, :, None].to(conv_state.dtype)], dim=-1)
    conv_state[live] = window[..., 1:]  # [R, C, kernel - 1]
    weight = conv1d.weight[:, 0, :]  # [C, kernel]
    out = (window.to(weight.dtype) * weight).sum(-1)  # [R, C]
    if conv1d.bias is not None:
        out = out + conv1d.bias
    return out


def conv_chunk_(
    padded: torch.Tensor,
    conv_state: torch.Tensor,
    slots: torch.Tensor,
    lens: torch.Tensor,
    conv1d: nn.Conv1d,
    taps: StateTaps | None = None,
) -> torch.Tensor:
    """Right-padded rows ``[R, L, C]`` (row r has ``lens[r]`` real inputs) continuing from
    their slots' inputs -> conv outputs ``[R, L, C]`` (no activation); the slots keep each
    row's last ``kernel - 1`` real inputs, and each tap's slot the last ``kernel - 1`` inputs
    before its boundary (written before the live slots change)."""
    k = conv1d.weight.shape[-1] - 1
    seq = torch.cat([conv_state[slots].to(padded.dtype), padded.transpose(1, 2)], dim=-1)
    if taps is not None:
        at = taps.lens[:, None] + torch.arange(k, device=seq.device)  # [K, k]
        windows = seq[taps.rows[:, None], :, at]  # [K, k, C]
        conv_state[taps.slots] = windows.transpose(1, 2).to(conv_state.dtype)
    idx = lens[:, None] + torch.arange(k, device=seq.device)  # [R, k]
    last = seq.gather(2, idx[:, None, :].expand(-1, seq.shape[1], -1))  # [R, C, k]
    conv_state[slots] = last.to(conv_state.dtype)
    out = F.conv1d(seq, conv1d.weight, conv1d.bias, groups=seq.shape[1])  # [R, C, L]
    return out.transpose(1, 2)
