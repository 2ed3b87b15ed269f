"""Token log-probs and entropies without a float32 copy of the logits (pure torch).

Data in: logits ``[N, V]`` (:func:`logprobs_from_logits`), or final hidden states and the LM
head's weight (:func:`logprobs_from_hidden`), with labels and a temperature. Data out:
``log softmax(logits / temperature)[label]`` and entropies, float32, differentiable.
Must never hold a float32 ``[tokens, vocab]`` tensor: it works on chunks of ``max_chunk_elems``
logits. :func:`token_logprobs` and :func:`token_entropy` are the ``[B, L, V]`` forms.
"""

from __future__ import annotations

import torch

# Logits per chunk: 2^26 float32 values (256 MiB; a chunk's forward or backward holds a few such
# buffers), 441 tokens of Qwen2.5's 151,936-word vocabulary.
MAX_CHUNK_ELEMS = 1 << 26


def _rows_per_chunk(vocab: int, max_chunk_elems: int) -> int:
    return max(1, max_chunk_elems // max(vocab, 1))


def _inverse_temperature(
    temperature: torch.Tensor | float, n: int, device: torch.device
) -> torch.Tensor:
    """``1 / temperature`` per token, ``[N]`` float32 (a number is spread over the tokens)."""
    if isinstance(temperature, torch.Tensor):
        return temperature.to(device=device, dtype=torch.float32).reshape(n).reciprocal()
    return torch.full((n,), 1.0 / float(temperature), dtype=torch.float32, device=device)


def _chunk_stats(
    z: torch.Tensor, labels: torch.Tensor, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of ``labels`` and entropy per row of one float32 chunk ``z [c, V]`` (one
    ``[c, V]`` temporary at most)."""
    log_z = torch.logsumexp(z, dim=-1)  # [c]
    logprob = z.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - log_z  # [c]
    if not with_entropy:
        return logprob, None
    probs = torch.softmax(z, dim=-1)  # [c, V]
    return logprob, log_z - torch.linalg.vecdot(probs, z)  # H = log Z - E[z]


def _chunk_grad(
    z: torch.Tensor,
    labels: torch.Tensor,
    inv_t: torch.Tensor,
    g_logprob: torch.Tensor | None,
    g_entropy: torch.Tensor | None,
) -> torch.Tensor:
    """d loss / d raw logits of one chunk, from the upstream gradients of its log-probs and
    entropies (either may be None: not used by the loss). ``z`` (float32 ``[c, V]``, the
    caller's own) is overwritten and the result takes the softmax's memory.

    grad_z = p * (-g_lp - g_H * (z - E[z])) + onehot(label) * g_lp."""
    probs = torch.softmax(z, dim=-1)  # [c, V]
    g_lp = torch.zeros_like(z[:, 0]) if g_logprob is None else g_logprob.float()  # [c]
    if g_entropy is None:
        grad = probs.mul_(-g_lp.unsqueeze(-1))
    else:
        expected = torch.linalg.vecdot(probs, z)  # [c]
        factor = (
            z.sub_(expected.unsqueeze(-1))
            .mul_(-g_entropy.float().unsqueeze(-1))
            .sub_(g_lp.unsqueeze(-1))
        )
        grad = probs.mul_(factor)
    grad.scatter_add_(-1, labels.unsqueeze(-1), g_lp.unsqueeze(-1))
    return grad.mul_(inv_t.unsqueeze(-1))


class _FromLogits(torch.autograd.Function):
    """Chunked log-probs of logits, recomputing each chunk's softmax in the backward so only one
    chunk is ever in float32. Written naively, autograd keeps a float32 ``[tokens, vocab]`` copy
    for the backward (8192 x 151,936 x 4 B = 5 GB for a Qwen2.5 batch). ``z = logits /
    temperature`` in float32, as vLLM's sampler and veRL's actor compute it.

    Gradients, with ``p = softmax(z)`` and ``E = sum(p * z)``: ``d logp[y] / dz = onehot(y) - p``;
    ``dH / dz = -p * (z - E)``; ``dz / dlogits = 1 / temperature``.
    """

    @staticmethod
    def forward(ctx, logits, labels, inv_t, step: int, with_entropy: bool):
        n = logits.shape[0]
        logprob = torch.empty(n, dtype=torch.float32, device=logits.device)
        entropy = (
            torch.empty(n, dtype=torch.float32, device=logits.device) if with_entropy else None
        )
        for s in range(0, n, step):
            z = logits[s : s + step].float() * inv_t[s : s + step].unsqueeze(-1)  # [c, V]
            lp, ent = _chunk_stats(z, labels[s : s + step], with_entropy)
            logprob[s : s + step] = lp
            if entropy is not None:
                entropy[s : s + step] = ent
        ctx.save_for_backward(logits, labels, inv_t)
        ctx.step = step
        ctx.set_materialize_grads(False)
        return logprob, entropy

    @staticmethod
    def backward(ctx, g_logprob, g_entropy):
        logits, labels, inv_t = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for s in range(0, logits.shape[0], ctx.step):
            z = logits[s : s + ctx.step].float() * inv_t[s : s + ctx.step].unsqueeze(-1)
            part = lambda g: None if g is None else g[s : s + ctx.step]
            grad[s : s + ctx.step] = _chunk_grad(
                z,
                labels[s : s + ctx.step],
                inv_t[s : s + ctx.step],
                part(g_logprob),
                part(g_entropy),
            ).to(grad.dtype)
        return grad, None, None, None, None


class _FromHidden(torch.autograd.Function):
    """As :class:`_FromLogits` of ``hidden @ weight.T``, computing that product per chunk in the
    forward and again in the backward: the logits exist one chunk at a time, never whole (in
    any dtype). The head's gradient is accumulated over chunks in float32."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, inv_t, step: int, with_entropy: bool):
        n = hidden.shape[0]
        logprob = torch.empty(n, dtype=torch.float32, device=hidden.device)
        entropy = (
            torch.empty(n, dtype=torch.float32, device=hidden.device) if with_entropy else None
        )
        for s in range(0, n, step):
            z = (hidden[s : s + step] @ weight.T).float() * inv_t[s : s + step].unsqueeze(
                -1
            )  # [c, V]
            lp, ent = _chunk_stats(z, labels[s : s + step], with_entropy)
            logprob[s : s + step] = lp
            if entropy is not None:
                entropy[s : s + step] = ent
        ctx.save_for_backward(hidden, weight, labels, inv_t)
        ctx.step = step
        ctx.set_materialize_grads(False)
        return logprob, entropy

    @staticmethod
    def backward(ctx, g_logprob, g_entropy):
        hidden, weight, labels, inv_t = ctx.saved_tensors
        want_hidden, want_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden) if want_hidden else None
        # summed over chunks in float32 (in bf16 each chunk's addition would round the total)
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if want_weight else None
        for s in range(0, hidden.shape[0], ctx.step):
            h = hidden[s : s + ctx.step]  # [c, H]
            z = (h @ weight.T).float() * inv_t[s : s + ctx.step].unsqueeze(-1)
            part = lambda g: None if g is None else g[s : s + ctx.step]
            g_z = _chunk_grad(
                z,
                labels[s : s + ctx.step],
                inv_t[s : s + ctx.step],
                part(g_logprob),
                part(g_entropy),
            ).to(weight.dtype)  # [c, V]
            if grad_hidden is not None:
                grad_hidden[s : s + ctx.step] = g_z @ weight
            if grad_weight is not None and weight.dtype == torch.float32:
                grad_weight.addmm_(g_z.T, h)  # [V, H], in place
            elif (
                grad_weight is not None
            ):  # the product in the weight's dtype (fast), the sum in float32
                grad_weight += g_z.T @ h
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None


def logprobs_from_logits(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: torch.Tensor | float = 1.0,
    with_entropy: bool = False,
    max_chunk_elems: int = MAX_CHUNK_ELEMS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``logits [N, V]`` (any float dtype, kept as given for the backward), ``labels [N]``
    (valid ids), ``temperature`` one number or ``[N]`` -> log-probs ``[N]`` and
    (``with_entropy``) entropies ``[N]``, float32, differentiable."""
    inv_t = _inverse_temperature(temperature, logits.shape[0], logits.device)
    step = _rows_per_chunk(logits.shape[-1], max_chunk_elems)
    return _FromLogits.apply(logits, labels, inv_t, step, with_entropy)


def logprobs_from_hidden(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: torch.Tensor | float = 1.0,
    with_entropy: bool = False,
    max_chunk_elems: int = MAX_CHUNK_ELEMS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Final hidden states ``[N, H]`` and the LM head's weight ``[V, H]`` (no bias) -> as
    :func:`logprobs_from_logits` of ``hidden @ weight.T``, without materialising those logits;
    gradients flow to ``hidden`` and ``weight``."""
    inv_t = _inverse_temperature(temperature, hidden.shape[0], hidden.device)
    step = _rows_per_chunk(weight.shape[0], max_chunk_elems)
    return _FromHidden.apply(hidden, weight, labels, inv_t, step, with_entropy)


def _per_position(temperature: torch.Tensor | float, shape: torch.Size) -> torch.Tensor | float:
    """A temperature per row (``[B]``) spread over the positions of ``shape`` (``[B, L]``) and
    flattened (``[B*L]``); a number stays a number."""
    if not isinstance(temperature, torch.Tensor):
        return float(temperature)
    per_row = temperature.float().reshape(-1, *([1] * (len(shape) - 1)))  # [B, 1]
    return per_row.expand(shape).reshape(-1)  # [B*L]


def token_logprobs(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: torch.Tensor | float = 1.0,
    max_chunk_elems: int = MAX_CHUNK_ELEMS,
) -> torch.Tensor:
    """log softmax(logits / temperature)[label] per position: ``[B, L, V]``, ``[B, L]`` ->
    ``[B, L]`` float32; ``temperature`` one number or one per row (``[B]``). Labels must be
    valid ids; mask padding afterwards."""
    flat = logits.reshape(-1, logits.shape[-1])  # [B*L, V]
    logprob, _ = logprobs_from_logits(
        flat,
        labels.reshape(-1),
        max_chunk_elems=max_chunk_elems,
        temperature=_per_position(temperature, labels.shape),
    )
    return logprob.reshape(labels.shape)


def token_entropy(
    logits: torch.Tensor,
    *,
    temperature: torch.Tensor | float = 1.0,
    max_chunk_elems: int = MAX_CHUNK_ELEMS,
) -> torch.Tensor:
    """Entropy of softmax(logits / temperature) per position: ``[B, L, V]`` -> ``[B, L]``
    float32. H = logsumexp(z) - sum softmax(z) * z (logits must be finite)."""
    flat = logits.reshape(-1, logits.shape[-1])  # [B*L, V]
    labels = torch.zeros(flat.shape[0], dtype=torch.long, device=flat.device)
    _, entropy = logprobs_from_logits(
        flat,
        labels,
        with_entropy=True,
        max_chunk_elems=max_chunk_elems,
        temperature=_per_position(temperature, logits.shape[:-1]),
    )
    return entropy.reshape(logits.shape[:-1])
