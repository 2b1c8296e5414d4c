"""Policy-loss algorithms: small pure functions over padded [B, T] tensors (docs/algorithms.md).

How the trainer uses this package, one training step (B episodes padded to T tokens; ``mask`` [B, T]
is 1 only on policy tokens; rewards [B]; group ids [B] as a list or LongTensor):

    # 0. Episode filters, on python lists, before tensors exist:
    keep = dynamic_sampling_keep(rewards, group_ids)              # DAPO: informative groups only
    rewards = [r + p for r, p in zip(rewards, overlong_penalty(lengths, max_len, cache_len))]  # DAPO
    mask *= torch.tensor(void_turn_multipliers(has_void))[:, None]  # SimpleTIR: no loss, stays in group
    # 1. Advantages, per sequence:
    adv = compute_advantages("grpo", rewards, group_ids)          # [B]; also dr_grpo, rloo
    # 2. Before the update, under no_grad, per micro-batch (bounded memory):
    logp_old, ent = token_logprobs_and_entropy(logits, ids, temperature, chunk_size)  # [b, T] each
    #    (or token_logprobs_and_entropy_from_hidden(hidden, lm_head.weight, ids, ...) for big vocabs)
    # 3. Token weighting ONCE on the WHOLE batch (detached); stateful methods return a new state:
    inputs = WeightingInputs.build(logp_old, ent, adv, mask)
    tw = compute_weights(name, inputs, **params)                  # TokenWeights (+ tw.stats, tw.state)
    #    e.g. compute_weights("stare", inputs, variant="C2", target_entropy=0.3,
    #             controller=StareController(law="pi", ...), state=stare_state, scope="batch")
    norm = loss_normaliser(tw.mask, agg_mode, max_len)            # denominator of one optimizer step
    #    (with several mini-batch steps per batch: loss_normaliser(tw.mask[mini_rows], ...) per step)
    # 4. Per micro-batch (rows idx), with gradient; the losses sum to the full-batch loss:
    logp, ent = token_logprobs_and_entropy(model(...).logits, ids, temperature, chunk_size)
    part = tw.rows(idx)
    loss, stats, clip_status = policy_loss(logp, logp_old[idx], adv[idx], part.mask, normaliser=norm,
                              agg_mode=agg_mode, weights=part.weights, clip=part.clip,
                              abs_kl_weights=part.abs_kl_weights, clip_low=0.2, clip_high=0.28,
                              dual_clip=3.0, entropy=ent, entropy_coef=0.0)
    loss.backward()

Every method has one record (``registry``): ``WEIGHTINGS`` (``none``, ``stare``, ``steer``, ``stapo``,
``clip_cov``, ``kl_cov``, ``high_entropy``; each ``compute`` takes ``WeightingInputs`` and keyword
parameters and returns ``TokenWeights``; ``arguments(settings, step)`` makes those parameters from its
config section), ``ADVANTAGES``, ``AGGREGATIONS`` and ``METHODS`` (the values of ``algorithm.name``). Methods whose released code reads the current policy select on ``logp_old``
before the update; see ``token_weights`` for why that is exact with one optimizer step per batch.
STARE's controller state (``StareState``) is returned as ``tw.state``; keep it and checkpoint it
with ``to_dict``/``from_dict``. ``docs/algorithms.md`` maps every name to its formula and source.
"""

from agentrl.algorithms import presets  # noqa: F401  (registers grpo, dr_grpo, rloo, dapo, none)
from agentrl.algorithms.advantages import compute_advantages
from agentrl.algorithms.covariance import clip_cov_weights, kl_cov_weights, token_covariance
from agentrl.algorithms.entropy_theory import (
    entropy_phi,
    exact_entropy_change,
    first_order_entropy_change,
)
from agentrl.algorithms.filters import (
    dynamic_sampling_keep,
    overlong_penalty,
    void_turn_multipliers,
)
from agentrl.algorithms.high_entropy import high_entropy_weights
from agentrl.algorithms.losses import (
    KL_ESTIMATORS,
    PolicyLoss,
    aggregate,
    clip_status,
    clipped_surrogate,
    importance_ratio,
    k1_kl,
    k2_kl,
    k3_kl,
    kl_penalty,
    loss_normaliser,
    policy_loss,
    token_shares,
)
from agentrl.algorithms.masked import masked_mean, masked_quantile
from agentrl.algorithms.registry import (
    ADVANTAGES,
    AGGREGATIONS,
    METHODS,
    WEIGHTINGS,
    AdvantageEstimator,
    LossAggregation,
    Method,
    StepContext,
    TokenWeighting,
    compute_weights,
    register_advantage,
    register_aggregation,
    register_method,
    register_weighting,
)
from agentrl.algorithms.stapo import stapo_weights
from agentrl.algorithms.stare import stare_weights
from agentrl.algorithms.stare_control import (
    CONTROL_LAWS,
    StareController,
    StareState,
    update_stare_state,
)
from agentrl.algorithms.steer import steer_weights
from agentrl.algorithms.token_stats import (
    entropy_from_logits,
    token_logprobs_and_entropy,
    token_logprobs_and_entropy_from_hidden,
    token_stats_with_phi,
    token_stats_with_phi_from_hidden,
)
from agentrl.algorithms.token_weights import TokenWeights, WeightingInputs, unit_weights

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "CONTROL_LAWS",
    "KL_ESTIMATORS",
    "METHODS",
    "WEIGHTINGS",
    "AdvantageEstimator",
    "LossAggregation",
    "Method",
    "PolicyLoss",
    "StareController",
    "StareState",
    "StepContext",
    "TokenWeighting",
    "TokenWeights",
    "WeightingInputs",
    "aggregate",
    "clip_cov_weights",
    "clip_status",
    "clipped_surrogate",
    "compute_advantages",
    "compute_weights",
    "dynamic_sampling_keep",
    "entropy_from_logits",
    "entropy_phi",
    "exact_entropy_change",
    "first_order_entropy_change",
    "high_entropy_weights",
    "importance_ratio",
    "k1_kl",
    "k2_kl",
    "k3_kl",
    "kl_cov_weights",
    "kl_penalty",
    "loss_normaliser",
    "masked_mean",
    "masked_quantile",
    "overlong_penalty",
    "policy_loss",
    "register_advantage",
    "register_aggregation",
    "register_method",
    "register_weighting",
    "stapo_weights",
    "stare_weights",
    "steer_weights",
    "token_covariance",
    "token_logprobs_and_entropy",
    "token_logprobs_and_entropy_from_hidden",
    "token_shares",
    "token_stats_with_phi",
    "token_stats_with_phi_from_hidden",
    "unit_weights",
    "update_stare_state",
    "void_turn_multipliers",
]
