"""Trinity-RFT's ``difficulty_based`` task selector as pure functions: a Beta estimate of each
row's pass rate, updated from the pass rates a step observed, and the rows a draw takes.

Data in: two feature columns per row (``data_selector.feature_keys``: the pass rates of a weaker
and a stronger reference model), the selector's ``kwargs`` (:class:`rft.config.schema.DifficultyArgs`), per step
the rows run and their mean rewards. Data out: :class:`PassRateBeliefs` (the state) and
:func:`choose` (the rows of one draw). No I/O: :mod:`rft.explorer.selectors` feeds it.

Trinity's semantics (trinity/buffer/selector/selector.py ``DifficultyBasedSelector`` and
difficulty_estimator.py ``InterpolationBetaPREstimator``): each row's pass rate is
Beta(alpha, beta), both 1 at first. A step's feedback (rows i with observed rates r_i) first
moves a capability coefficient c (the observed mean placed between the two reference models'
mean rates; the first estimate, then an exponential average with discount 0.9), predicts every
row's rate as p~ = clip(f0 + c (f1 - f0), 0, 1) (observed rows: their r_i), then

    alpha <- (1 - lamb) alpha + lamb + (1 - rho) s + rho p~ m
    beta  <- (1 - lamb) beta  + lamb + (1 - rho) f + rho (1 - p~) m

with s = r m, f = (1 - r) m on observed rows (0 elsewhere); ``adaptive_rho`` halves rho when the
prediction missed the observed rates by 0.25 or more on average. A draw scores rows by
-|target_reward - p| (p the Beta mean, or a Beta sample with ``do_sample``) and takes the k best
(``tau: 0``) or k without replacement from softmax(score / tau). The random streams are seeded
with seed + the draw's first position, as Trinity's; they are numpy's, so the draws follow
Trinity's distribution, not its torch generator's exact picks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from rft.config.schema import DifficultyArgs

CAPABILITY_DISCOUNT = 0.9  # Trinity's cap_coef_update_discount (not a selector kwarg there)
ADAPTIVE_RHO_ERROR = 0.25  # mean |predicted - observed| at which adaptive_rho halves rho
ANCHOR_EPS = 1e-6  # keeps the capability estimate finite when both anchors are equal


@dataclass(frozen=True)
class PassRateBeliefs:
    """Every row's Beta(alpha, beta) pass-rate belief and the estimator's running values."""

    alphas: np.ndarray  # [rows]
    betas: np.ndarray  # [rows]
    capability: float | None = None  # c: None until the first feedback
    rho: float = 0.2  # the current rho (adaptive_rho halves it)

    @classmethod
    def initial(cls, rows: int, args: DifficultyArgs) -> "PassRateBeliefs":
        return cls(np.ones(rows), np.ones(rows), None, args.rho)

    def mean(self) -> np.ndarray:
        return self.alphas / (self.alphas + self.betas)  # [rows]


def update(
    beliefs: PassRateBeliefs,
    features: np.ndarray,  # [rows, 2]: the weaker and the stronger reference pass rate
    args: DifficultyArgs,
    rows: Sequence[int],
    rates: Sequence[float],
) -> PassRateBeliefs:
    """The beliefs after one step's feedback: ``rows`` (distinct) observed at mean reward
    ``rates``."""
    if not rows:
        return beliefs
    idx = np.asarray(rows, dtype=np.int64)
    observed = np.asarray(rates, dtype=float)
    low, high = features[idx].mean(axis=0)
    estimate = (observed.mean() - low) / (high - low + ANCHOR_EPS)
    cap = estimate
    if beliefs.capability is not None:
        cap = CAPABILITY_DISCOUNT * beliefs.capability + (1 - CAPABILITY_DISCOUNT) * estimate
    m = args.m
    successes = np.zeros(len(beliefs.alphas))
    failures = np.zeros(len(beliefs.alphas))
    successes[idx] = observed * m
    failures[idx] = (1 - observed) * m
    predicted = np.clip(features[:, 0] + cap * (features[:, 1] - features[:, 0]), 0.0, 1.0)
    rho = beliefs.rho
    if args.adaptive_rho and np.abs(predicted[idx] - observed).mean() >= ADAPTIVE_RHO_ERROR:
        rho *= 0.5  # Trinity halves it before this update uses it
    predicted[idx] = observed
    keep = 1 - args.lamb
    alphas = keep * beliefs.alphas + args.lamb + (1 - rho) * successes + rho * predicted * m
    betas = keep * beliefs.betas + args.lamb + (1 - rho) * failures + rho * (1 - predicted) * m
    return PassRateBeliefs(alphas, betas, float(cap), rho)


def choose(
    beliefs: PassRateBeliefs, args: DifficultyArgs, seed: int, position: int, k: int
) -> list[int]:
    """The ``k`` distinct rows of the draw starting at task ``position``."""
    rng = np.random.default_rng(seed + position)
    rates = rng.beta(beliefs.alphas, beliefs.betas) if args.do_sample else beliefs.mean()
    scores = -np.abs(args.target_reward - rates)  # [rows]
    if args.tau == 0:
        return np.argsort(-scores, kind="stable")[:k].tolist()
    logits = scores / args.tau
    weights = np.exp(logits - logits.max())
    return rng.choice(len(scores), k, replace=False, p=weights / weights.sum()).tolist()
