"""The token length budget, checked when the config loads (not at hour four of extraction).

A sample is a prompt plus its generated response; training reads it whole; extraction sends it to
vLLM and asks for one more token. So, in tokens:

    prompt_max_tokens + synth_max_tokens <= seq_length < max_model_len

With all three at 16,384 a response cut at the cap was exactly max_model_len tokens long, vLLM
refused the extraction request, and every rerun failed the same way.
"""

from __future__ import annotations

from collections.abc import Callable

KEYS = ("prompt_max_tokens", "synth_max_tokens", "seq_length", "max_model_len")


def problems(values: dict[str, str], where: Callable[[str], str]) -> list[str]:
    """The broken rules, one sentence each naming keys, values, the file that set them and the fix.
    values: the rendered vars (only the KEYS present are checked); where(key): the file that set it."""
    nums: dict[str, int] = {}
    out = []
    for k in KEYS:
        if k not in values:
            continue
        try:
            nums[k] = int(str(values[k]).strip())
        except ValueError:
            out.append(f"{where(k)}: vars.{k} = {values[k]!r} is not a whole number of tokens")
            continue
        if nums[k] <= 0:
            out.append(f"{where(k)}: vars.{k} = {nums[k]} must be a positive number of tokens")
    if out:
        return out

    def shown(*keys: str) -> str:
        return ", ".join(f"vars.{k} = {nums[k]:,} ({where(k)})" for k in keys)

    p, g, s, m = (nums.get(k) for k in KEYS)
    if None not in (p, g, s) and p + g > s:
        out.append(f"prompt_max_tokens + synth_max_tokens = {p + g:,} > seq_length = {s:,} [{shown(*KEYS[:3])}]: "
                   f"a long prompt with a full-length response would not fit a training sample. Fix: lower "
                   f"synth_max_tokens to {max(s - p, 1):,} or raise seq_length to {p + g:,}")
    if None not in (s, m) and s >= m:
        out.append(f"seq_length = {s:,} >= max_model_len = {m:,} [{shown('seq_length', 'max_model_len')}]: "
                   f"extraction sends a whole sample and asks vLLM for one more token, which vLLM refuses at "
                   f"max_model_len. Fix: raise max_model_len to at least {s + 1:,} (or lower seq_length "
                   f"below {m:,})")
    if None not in (p, g, m) and p + g >= m and not out:
        out.append(f"prompt_max_tokens + synth_max_tokens = {p + g:,} >= max_model_len = {m:,} "
                   f"[{shown('prompt_max_tokens', 'synth_max_tokens', 'max_model_len')}]: vLLM refuses such "
                   f"generation requests. Fix: raise max_model_len above {p + g:,}")
    return out
