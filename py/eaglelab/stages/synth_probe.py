"""A few requests before synth's long run, so a wrong server setup fails in minutes, not hours.

The seeds' first 10,000-trace run stored empty reasoning on every row; a run against a server with
the wrong chat template would teach the drafter a prompt format nobody serves. The probe sends the
first few prompts with synth's own sampling settings (and a short cap) and refuses to start when:

  - a request fails, or the server returns no token ids (return_token_ids needs vLLM >= 0.10);
  - a response is empty (no content, no reasoning, no tool call, no tokens);
  - the chat template did not render the prompt (the user's text is not in the prompt tokens, or
    nothing was added around it);
  - reasoning is expected (--reasoning) and no response carries any: either the server puts it in
    `content` (no --reasoning-parser) or the template's thinking mode is off.

`problems()` is pure (response dicts in, messages out); `probe()` does the HTTP.
"""

from __future__ import annotations

import requests

from ..errors import StageError

PROBE_TOKENS = 256  # enough to see reasoning start; a cut inside <think> is fine here


def reasoning_text(message: dict) -> str:
    """vLLM's reasoning field (`reasoning`, older releases `reasoning_content`), '' when absent."""
    return (message.get("reasoning") or message.get("reasoning_content") or "").strip()


def user_text(row: dict) -> str:
    turns = row.get("messages") or row.get("conversations") or []
    users = [t.get("content") or t.get("value") for t in turns if isinstance(t, dict)
             and t.get("role", t.get("from")) in ("user", "human")]
    texts = [u for u in users if isinstance(u, str)]
    return texts[-1] if texts else str(row.get("prompt") or "")


def problems(samples: list[dict], reasoning: bool) -> list[str]:
    """What is wrong with the probe's responses. Each sample: {"id", "user", "response", "prompt_text"}."""
    out = []
    with_reasoning = 0
    content_has_think = False
    for s in samples:
        data, sid = s["response"], s["id"]
        choice = (data.get("choices") or [{}])[0]
        msg = choice.get("message") or {}
        content, tool_calls, why = (msg.get("content") or "").strip(), msg.get("tool_calls"), reasoning_text(msg)
        if not data.get("prompt_token_ids") or choice.get("token_ids") is None:
            out.append(f"prompt {sid}: the server returned no token ids; synth needs return_token_ids (vLLM >= 0.10)")
            continue
        if not choice.get("token_ids") or not (content or why or tool_calls):
            out.append(f"prompt {sid}: empty response (finish_reason {choice.get('finish_reason')!r}, "
                       f"{len(choice.get('token_ids') or [])} tokens): check the chat template and the model")
        prompt_text, user = s.get("prompt_text"), s.get("user") or ""
        if prompt_text is not None and user:
            probe = user.strip()[:80]
            if probe and probe not in prompt_text:
                out.append(f"prompt {sid}: the user's text is not in the rendered prompt: the server's chat "
                           "template drops it (pass the model's own template, --chat-template)")
            elif len(prompt_text.strip()) <= len(user.strip()):
                out.append(f"prompt {sid}: the rendered prompt is the bare user text: the server applies no chat "
                           "template (the model has none; pass --chat-template in serve_vllm_args)")
        with_reasoning += bool(why)
        content_has_think |= "<think>" in content or "</think>" in content
    if reasoning and samples and not with_reasoning:
        if content_has_think:
            out.append("reasoning is expected but the server returns it inside `content`: start the target with "
                       "--reasoning-parser (Kimi: kimi_k2) in serve_vllm_args")
        else:
            out.append(f"reasoning is expected but none of {len(samples)} responses has any: the chat template's "
                       "thinking mode is off, or this is not a thinking model (or set synth_reasoning: --no-reasoning)")
    return out


def probe(endpoint: str, model: str, rows: list[dict], sampling: dict, max_tokens: int, reasoning: bool,
          n: int, timeout: float = 600) -> list[dict]:
    """Send the first n prompts; StageError listing every problem found. Returns the samples."""
    samples = []
    for row in rows[:n]:
        sid = row.get("id", len(samples))
        turns = row.get("messages") or [{"role": "user", "content": row.get("prompt", "")}]
        payload = {**sampling, "model": model, "messages": turns, "max_tokens": min(max_tokens, PROBE_TOKENS),
                   "return_token_ids": True}
        try:
            r = requests.post(f"{endpoint}/v1/chat/completions", json=payload, timeout=timeout)
        except requests.RequestException as e:
            raise StageError(f"synth probe: {endpoint}/v1/chat/completions: {e}") from None
        if not r.ok:
            hint = " (the model has no chat template: pass --chat-template)" if "chat template" in r.text.lower() else ""
            raise StageError(f"synth probe: prompt {sid}: HTTP {r.status_code} from {endpoint}/v1/chat/completions: "
                             f"{r.text[:300]}{hint}")
        data = r.json()
        samples.append({"id": sid, "user": user_text(row), "response": data,
                        "prompt_text": detokenize(endpoint, model, data.get("prompt_token_ids") or [])})
    found = problems(samples, reasoning)
    if found:
        raise StageError("synth probe: the server's answers to the first prompts are not usable training data, "
                         "so the long run was not started:\n  " + "\n  ".join(found))
    return samples


def detokenize(endpoint: str, model: str, ids: list[int]) -> str | None:
    """The prompt text the server rendered, from vLLM's /detokenize; None when unavailable."""
    if not ids:
        return None
    try:
        r = requests.post(f"{endpoint}/detokenize", json={"model": model, "tokens": ids}, timeout=60)
        return r.json().get("prompt") if r.ok else None
    except (requests.RequestException, ValueError):
        return None
