"""The config schema: one dataclass per section, a docstring under every field.

``agentrl.config`` loads, validates and resolves configs against these classes; ``describe_config()``
turns the docstrings into the table in ``docs/configuration.md``. Fields that default to ``None``
with "from the preset" in their docstring are filled from ``agentrl.config.PRESETS`` according to
``algorithm.name``; other ``None`` defaults say in their docstring what they resolve to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

AlgorithmName = Literal[
    "grpo", "dr_grpo", "dapo", "rloo", "stare", "steer", "stapo", "clip_cov", "kl_cov", "high_entropy"
]


def knob(default: Any = None, **bounds: float) -> Any:
    """A dataclass field with an optional range (ge, gt, le, lt), checked at load time."""
    assert set(bounds) <= {"ge", "gt", "le", "lt"}, bounds
    return field(default=default, metadata=bounds)


@dataclass
class RunConfig:
    name: str = "quickstart"
    """Run name; the run directory defaults to ``runs/<name>``."""
    output_dir: str | None = None
    """Where the run writes its resolved config, metrics, transcripts, checkpoints and plots. None = ``runs/<run.name>``."""
    seed: int = 0
    """Seed for task sampling, generation and initialisation; seeded runs reproduce."""
    device: Literal["cpu", "cuda", "auto"] = "auto"
    """Where the policy runs; ``auto`` picks CUDA when available."""
    deterministic: bool = False
    """Ask torch for deterministic kernels (slower on GPU; CPU runs are deterministic anyway)."""
    resume: bool = False
    """Continue from the newest checkpoint in ``output_dir`` if there is one."""


@dataclass
class ModelConfig:
    path: str = "tiny:h128-L8"
    """The policy: a local directory, a hub name, or ``tiny:<preset>`` for a tiny model built locally (e.g. ``tiny:h128-L8``)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Parameter dtype. float32 on CPU (bf16 autocast is ``trainer.bf16``); bfloat16 for large models on GPU."""
    tokenizer: str | None = None
    """Tokenizer location. None = ``model.path``."""
    attn_implementation: str | None = None
    """Passed to transformers (``sdpa``, ``eager``, ``flash_attention_2``...). None = transformers' default."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory, ~30% more compute."""


@dataclass
class EnvConfig:
    name: str = "calculator"
    """Environment registry name (``agentrl envs list``); checked against the registry when the run starts."""
    options: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the environment's constructor."""
    module: str | None = None
    """Your own environment: a module name (``my_pkg.my_env``) or a ``.py`` file (relative paths are resolved against the current directory) imported before the run, so its ``@register`` runs."""


@dataclass
class DataConfig:
    source: Literal["builtin", "file", "hub"] = "builtin"
    """Where tasks come from: ``builtin`` = the environment's own generator (``Environment.load_tasks``), ``file`` = a local file, ``hub`` = a dataset name."""
    path: str | None = None
    """File path (``source: file``) or dataset name (``source: hub``); unused for ``builtin``."""
    adapter: str = "auto"
    """Dataset adapter turning rows into tasks (``auto``, ``jsonl``, ``gsm8k``, ``math500``, ``aime``, ``dapo_math``...); checked by the adapter registry when tasks load."""
    columns: dict[str, str] = field(default_factory=dict)
    """Map task fields (``id``, ``prompt``, ``answer``) to dataset columns, e.g. ``{prompt: question}``; empty = the adapter's defaults."""
    train_split: str = "train"
    """Split used for training."""
    test_split: str = "test"
    """Split used for evaluation."""
    num_train: int | None = knob(None, ge=1)
    """Number of training tasks. None = all (for a generator: its default)."""
    num_test: int = knob(200, ge=1)
    """Number of held-out tasks."""
    options: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for the generator or adapter (difficulty knobs and the like)."""


@dataclass
class VLLMConfig:
    gpu_memory_utilization: float = knob(0.5, gt=0, le=1)
    """Fraction of GPU memory vLLM may take (the trainer shares the GPU)."""
    tensor_parallel_size: int = knob(1, ge=1)
    """GPUs per engine."""
    enforce_eager: bool = False
    """Skip graph capture: faster start, slower generation."""
    kv_cache_space_gib: float = knob(1.0, gt=0)
    """KV-cache size for the CPU build of vLLM (``VLLM_CPU_KVCACHE_SPACE``)."""


@dataclass
class RolloutConfig:
    engine: Literal["hf", "vllm"] = "hf"
    """Generation backend: ``hf`` = transformers in-process, ``vllm`` = vLLM (the ``vllm`` extra)."""
    group_size: int = knob(8, ge=1)
    """Episodes per task (G); advantages compare episodes within a group."""
    prompts_per_step: int = knob(16, ge=1)
    """Tasks per training step; a step trains on ``prompts_per_step × group_size`` episodes."""
    temperature: float = knob(1.0, gt=0)
    """Sampling temperature; entropies and logprobs are computed at this temperature."""
    top_p: float = knob(1.0, gt=0, le=1)
    """Nucleus sampling mass; 1 disables it."""
    top_k: int = knob(0, ge=0)
    """Keep only the k most likely tokens; 0 disables it."""
    max_turns: int = knob(4, ge=1)
    """Policy turns per episode."""
    max_tokens_per_turn: int = knob(256, ge=1)
    """New tokens per policy turn."""
    max_episode_tokens: int = knob(2048, ge=1)
    """Tokens in the whole episode context (prompt, policy turns, observations)."""
    max_tool_output_tokens: int = knob(256, ge=1)
    """Longer tool outputs keep their head and tail with a visible marker in between."""
    max_concurrent_episodes: int = knob(256, ge=1)
    """Episodes in flight at once per engine (others wait); also bounds open environments and sandbox sessions."""
    runner: Literal["lockstep", "async"] = "lockstep"
    """``lockstep`` = all active episodes generate a turn together, then all step; ``async`` = each episode asks for its next turn as soon as its observation is ready (continuous batching: a slow tool stalls only its own episode)."""
    workers: int = knob(0, ge=0)
    """Rollout workers: 0 = in-process; N = N Ray workers."""
    ray_address: str | None = None
    """Ray cluster to join (``auto`` or ``ray://host:port``). None = start a local one when ``workers`` > 0."""
    max_weight_lag: int = knob(0, ge=0)
    """How many weight versions a training episode may lag behind the trainer (0 = fully on-policy)."""
    train_on_truncated: bool = True
    """Train on episodes cut by a budget. False keeps them in group statistics but masks their tokens."""
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    """vLLM engine settings (used when ``engine: vllm``)."""


@dataclass
class OverlongConfig:
    enabled: bool | None = None
    """DAPO's soft overlong punishment added to the reward (ALGORITHMS.md §2). None = from the preset."""
    max_length: int | None = knob(None, ge=1)
    """L_max in policy tokens per episode. None = min(max_turns × max_tokens_per_turn, max_episode_tokens)."""
    cache_length: int | None = knob(None, ge=1)
    """L_cache, the buffer before L_max where the penalty ramps to -1. None = max_length / 5 (DAPO: 4096 of 20480)."""


@dataclass
class AdaptiveConfig:
    alpha: float = knob(0.01, gt=0)
    """Step of W and M per training step: W += α·sign(H_tgt − H̄), M -= α·sign(H_tgt − H̄)."""
    W_max: float = knob(1.5, ge=1)
    """Upper limit of W (lower limit 1)."""
    M_min: float = knob(0.5, ge=0, le=1)
    """Lower limit of M (upper limit 1)."""


@dataclass
class PIConfig:
    kp: float = knob(2.0, ge=0)
    """Proportional gain on the relative entropy error (H_tgt − H̄)/H_tgt."""
    ki: float = knob(0.2, ge=0)
    """Integral gain on the accumulated relative error (with anti-windup at the bounds)."""
    W_min: float = knob(1.0, ge=1)
    """W at the smallest positive strength: W = W_min + u·(W_max − W_min) for strength u ∈ (0, 1] (weights are 1 at u = 0)."""
    W_max: float = knob(3.0, ge=1)
    """W at full strength (u = 1)."""
    M_min: float = knob(0.0, ge=0, le=1)
    """M at full strength (u = 1)."""
    M_max: float = knob(1.0, ge=0, le=1)
    """M at the smallest positive strength: M = M_max − u·(M_max − M_min)."""
    P_max: float | None = knob(None, gt=0, le=1)
    """P grows from ``stare.P`` to this with the strength: P = P + u·(P_max − P). None = P stays fixed."""


@dataclass
class StareConfig:
    variant: Literal["O1", "C2"] = "O1"
    """O1 boosts high-surprisal positive tokens only (the released code's 7B default); C2 also damps high-surprisal negative tokens."""
    target_entropy: float = knob(0.3, gt=0)
    """H_tgt in nats: reweighting is on while the batch's token-mean entropy is below it."""
    P: float = knob(0.1, gt=0, le=1)
    """Fraction of positive (and negative) tokens selected, by highest surprisal."""
    W: float = knob(1.1, ge=1)
    """Weight of selected positive tokens (paper: 1.1 for 7B; tiny models need ~2-3, ALGORITHMS.md §9)."""
    M: float = knob(0.9, ge=0, le=1)
    """Weight of selected negative tokens (C2 only)."""
    scope: Literal["batch", "micro"] = "batch"
    """Rank tokens over the whole training batch (paper) or per micro-batch (released code)."""
    controller: Literal["gate", "adaptive", "pi"] = "gate"
    """How W and M are set: ``gate`` = fixed values while H̄ < H_tgt; ``adaptive`` = the paper's sign controller; ``pi`` = proportional-integral on the entropy error."""
    adaptive: AdaptiveConfig = field(default_factory=AdaptiveConfig)
    """Settings of the ``adaptive`` controller."""
    pi: PIConfig = field(default_factory=PIConfig)
    """Settings of the ``pi`` controller."""


@dataclass
class SteerConfig:
    mode: Literal["linear", "exp"] = "linear"
    """How weights shrink with the entropy-change estimate |Ω|."""
    w_min: float = knob(0.8, gt=0, le=1)
    """Smallest token weight."""
    w_max: float = knob(1.2, ge=1)
    """Largest token weight (linear mode)."""


@dataclass
class StapoConfig:
    tau_p: float = knob(0.002, ge=0, le=1)
    """Drop positive-advantage tokens whose probability is below this..."""
    entropy_quantile: float = knob(0.8, ge=0, le=1)
    """...and whose entropy is below this quantile of the batch's entropy."""


@dataclass
class ClipCovConfig:
    ratio: float = knob(2e-4, gt=0, le=1)
    """Fraction of tokens whose gradient is cut (at least one)."""
    lb: float = 1.0
    """Lower bound on the centred covariance for a token to be a candidate."""
    ub: float = 5.0
    """Upper bound on the centred covariance for a token to be a candidate."""


@dataclass
class KLCovConfig:
    ratio: float = knob(2e-3, gt=0, le=1)
    """Fraction of tokens (top by covariance) that get the KL penalty."""
    coef: float = knob(1.0, ge=0)
    """β, the coefficient of |logp − logp_old| on those tokens."""


@dataclass
class HighEntropyConfig:
    rho: float = knob(0.2, gt=0, le=1)
    """Fraction of tokens (highest entropy) that keep their gradient."""


@dataclass
class AlgorithmConfig:
    name: AlgorithmName = "grpo"
    """The method: picks the token weighting and the defaults of the preset fields (table below)."""
    advantage: Literal["grpo", "dr_grpo", "rloo"] | None = None
    """Group advantage estimator. None = from the preset."""
    loss_agg: (
        Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"] | None
    ) = None
    """How per-token losses are averaged (ALGORITHMS.md §0). None = from the preset."""
    clip_low: float | None = knob(None, ge=0, lt=1)
    """ε_low: the ratio is clipped below at 1 − ε_low. None = from the preset."""
    clip_high: float | None = knob(None, ge=0)
    """ε_high: the ratio is clipped above at 1 + ε_high. None = from the preset."""
    ratio_clip: bool | None = None
    """Apply the PPO ratio clip at all (KL-Cov does not). None = from the preset."""
    dual_clip: float | None = knob(3.0, gt=1)
    """Dual-clip constant c bounding the loss of negative-advantage tokens; None disables it."""
    kl_coef: float = knob(0.0, ge=0)
    """β of the k3 KL penalty to the reference model; 0 = no reference model."""
    entropy_coef: float = knob(0.0, ge=0)
    """β_H of the entropy bonus; 0 = off."""
    dynamic_sampling: bool | None = None
    """Drop groups whose rewards are all equal and sample more until the batch is full. None = from the preset."""
    max_sampling_rounds: int = knob(4, ge=1)
    """Generation rounds per step with dynamic sampling before training on what there is."""
    void_turn_masking: bool = True
    """Episodes with a turn that has neither a tool call nor an answer keep their reward but get no gradient (SimpleTIR)."""
    overlong: OverlongConfig = field(default_factory=OverlongConfig)
    """Soft overlong punishment."""
    is_correction: Literal["none", "tis"] = "none"
    """Importance-sampling correction for rollout/trainer mismatch: ``tis`` = truncated IS weights."""
    is_cap: float = knob(2.0, ge=1)
    """Cap C of the truncated importance weights."""
    stare: StareConfig = field(default_factory=StareConfig)
    """STARE (ALGORITHMS.md §4)."""
    steer: SteerConfig = field(default_factory=SteerConfig)
    """STEER (ALGORITHMS.md §5)."""
    stapo: StapoConfig = field(default_factory=StapoConfig)
    """STAPO (ALGORITHMS.md §5)."""
    clip_cov: ClipCovConfig = field(default_factory=ClipCovConfig)
    """Clip-Cov (ALGORITHMS.md §5)."""
    kl_cov: KLCovConfig = field(default_factory=KLCovConfig)
    """KL-Cov (ALGORITHMS.md §5)."""
    high_entropy: HighEntropyConfig = field(default_factory=HighEntropyConfig)
    """High-entropy minority tokens (ALGORITHMS.md §5)."""


@dataclass
class TrainerConfig:
    total_steps: int = knob(200, ge=1)
    """Training steps (one step = one batch of rollouts and its updates)."""
    lr: float = knob(1e-6, gt=0)
    """AdamW learning rate (1e-6 is the GPU-scale value; tiny CPU models need ~1e-5)."""
    weight_decay: float = knob(0.01, ge=0)
    """AdamW weight decay."""
    betas: tuple[float, float] = knob((0.9, 0.999), ge=0, lt=1)
    """AdamW betas."""
    grad_clip: float | None = knob(1.0, gt=0)
    """Clip the gradient norm to this; None = no clipping."""
    warmup_steps: int = knob(0, ge=0)
    """Linear learning-rate warm-up steps."""
    lr_schedule: Literal["constant", "cosine"] = "constant"
    """Learning rate after warm-up."""
    mini_batches_per_step: int = knob(1, ge=1)
    """Optimizer updates per step; the step's groups are split evenly between them."""
    epochs_per_step: int = knob(1, ge=1)
    """Passes over the step's batch."""
    micro_batch_size: int = knob(8, ge=1)
    """Episodes per forward/backward; gradients accumulate up to a mini-batch (same result at any size)."""
    share_prefix: bool = True
    """Run the prompt prefix a micro-batch shares (system prompt, tool schemas) once per forward instead of once per episode: same losses and gradients, less compute. Off under DDP and gradient checkpointing."""
    bf16: bool = False
    """bf16 autocast in forward/backward (faster from ~15M parameters up)."""
    checkpoint_every: int = knob(0, ge=0)
    """Save a checkpoint every N steps; 0 = only at the end."""
    keep_checkpoints: int = knob(2, ge=1)
    """How many recent checkpoints to keep."""
    eval_every: int = knob(0, ge=0)
    """Evaluate every N steps; 0 = off."""
    max_wall_minutes: float | None = knob(None, gt=0)
    """Stop (after a checkpoint) once this much wall time has passed; None = no limit."""


@dataclass
class SFTConfig:
    enabled: bool = False
    """Warm-start with supervised fine-tuning before RL when the model has no warm start yet."""
    demos: str | None = None
    """JSONL file of chat demonstrations; None = generate them with the environment's solver."""
    num_demos: int = knob(512, ge=1)
    """Demonstrations to generate (or to read, at most)."""
    steps: int | None = knob(None, ge=1)
    """Optimizer steps; None = ``epochs`` passes over the demonstrations."""
    epochs: int = knob(1, ge=1)
    """Passes over the demonstrations when ``steps`` is None."""
    lr: float = knob(1e-5, gt=0)
    """Learning rate (tiny models trained from scratch need ~1e-3)."""
    batch_size: int = knob(16, ge=1)
    """Demonstrations per step."""
    cache: bool = True
    """Reuse a warm start made earlier with the same model, demonstrations and settings."""
    seed: int | None = None
    """Seed of the warm start (demonstrations, their order, the SFT run); None = ``run.seed``. Fix it to share one warm start across RL seeds, as ``agentrl study`` does."""
    exclude_train_seeds: list[int] = field(default_factory=list)
    """Keep the demonstrations off RL's training tasks: demonstrations are then drawn from a separate task stream, minus every task whose prompt is among the training tasks RL draws with these run seeds. Empty = demonstrations come from the training tasks of the SFT seed (the default; with a small problem space the warm start can then memorise the problems RL trains on)."""


@dataclass
class EvalConfig:
    k: int = knob(8, ge=1)
    """Samples per task; reports mean@k and pass@k."""
    num_tasks: int | None = knob(None, ge=1)
    """Tasks to evaluate; None = all loaded held-out tasks (``data.num_test``)."""
    temperature: float = knob(1.0, ge=0)
    """Sampling temperature; 0 = greedy."""
    split: Literal["train", "test"] = "test"
    """Which task set to evaluate on: ``test`` = ``data.test_split``, ``train`` = ``data.train_split``."""


@dataclass
class LimitsConfig:
    wall_s: float = knob(10.0, gt=0)
    """Wall-clock limit per execution, seconds."""
    cpu_s: float = knob(10.0, gt=0)
    """CPU-time limit per execution, seconds."""
    memory_mb: int = knob(512, ge=16)
    """Memory limit, MiB."""
    max_procs: int = knob(32, ge=1)
    """Process/thread limit."""
    output_bytes: int = knob(65536, ge=1)
    """stdout/stderr kept per execution; the rest is cut and marked."""
    file_size_mb: int = knob(16, ge=0)
    """Largest file the code may write, MiB."""


@dataclass
class SandboxConfig:
    backend: Literal["bwrap", "docker", "e2b", "unisolated"] = "bwrap"
    """Code execution: ``bwrap`` = bubblewrap on this machine, ``docker``, ``e2b`` (cloud), ``unisolated`` = plain subprocess."""
    allow_unisolated: bool = False
    """DANGEROUS: permit ``backend: unisolated``, which runs model-written code as your user with your files and network. Only for trusted code in a throwaway machine."""
    warm_sessions: int = knob(0, ge=0)
    """Interpreter sessions started ahead of time in each rollout process, so an episode's first cell does not wait for a container or interpreter to start (renamed from ``pool_size``)."""
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    """Resource limits per execution."""
    docker_image: str = "agentrl-sandbox:local"
    """Image for the ``docker`` backend. The default is built locally by ``.ci/docker_setup.sh`` (no pull needed); it bind-mounts the host's ``/usr`` read-only (docs/sandboxes.md)."""
    e2b_template: str | None = None
    """E2B sandbox template; None = E2B's default code interpreter."""


@dataclass
class LoggingConfig:
    tensorboard: bool = True
    """Write TensorBoard event files."""
    wandb: bool = False
    """Log to Weights & Biases (needs ``wandb`` installed and a login)."""
    wandb_project: str = "agentrl"
    """W&B project name."""
    plots: bool = True
    """Write PNG plots of the main curves into the run directory."""
    transcripts: bool = True
    """Write episode transcripts (JSONL)."""
    transcript_every: int = knob(1, ge=1)
    """Write transcripts every N steps."""
    log_every: int = knob(1, ge=1)
    """Print and log metrics every N steps."""


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    """Run identity and output."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """The environment."""
    data: DataConfig = field(default_factory=DataConfig)
    """Where tasks come from."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Generation and episode budgets."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """The RL objective."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Optimisation."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """Supervised warm start."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Evaluation."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """Code execution."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """What the run records."""
