"""The config schema: one dataclass per section, a docstring under every field; the sections of the
run's machinery (``sandbox``, ``timeouts``, ``proxy``, ``logging``) are in ``schema_runtime.py``.

``agentrl.config`` loads, validates and resolves configs against these classes; ``describe_config()``
turns the docstrings into the table in ``docs/configuration.md``. Fields that default to ``None``
with "from the preset" in their docstring are filled from the preset of ``algorithm.name`` (its
record in ``agentrl.algorithms.registry.METHODS``); other ``None`` defaults say in their docstring
what they resolve to. The settings of each token weighting (``algorithm.stare``, ``algorithm.steer``,
...) are defined next to the method, in its record, and appear here as registered sections. Below the
schema, three readers of a built config: ``output_dir``, ``weighting_name``, ``weighting_settings``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from agentrl.algorithms import registry
from agentrl.config.schema_runtime import LoggingConfig, ProxyConfig, SandboxConfig, TimeoutsConfig
from agentrl.dataclass_tree import HasSections, knob, registered_sections
from agentrl.engines.registry import ENGINES
from agentrl.sync.registry import OBJECT_STORE, TRANSPORTS


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
    threads: int | None = knob(None, ge=1)
    """Threads torch computes with in this process (``torch.set_num_threads``). None = torch's default, one per core: the fastest on a machine of its own, but on a shared one each thread waits for a core: on 2 cores, SFT steps with 2 threads took 1.8x as long as with 1 beside one busy process, 2.9x beside two (bench/threads.py, docs/performance.md). Set it to the cores this job has to itself; the run says so when the machine is busy at its start."""
    deterministic: bool = False
    """Ask torch for deterministic kernels (slower on GPU; CPU runs are deterministic anyway)."""
    resume: bool = False
    """Continue from the newest checkpoint in ``output_dir`` if there is one."""


@dataclass
class LoraConfig:
    rank: int = knob(0, ge=0)
    """LoRA adapter rank r; 0 = no LoRA (full fine-tuning). With r > 0 only the adapters train and enter the optimizer (peft); the engine samples with the merged weights."""
    alpha: float = knob(16.0, gt=0)
    """Scale numerator: the adapter's update is multiplied by alpha / rank."""
    dropout: float = knob(0.0, ge=0, lt=1)
    """Dropout on the adapter's input during training (0 keeps the trainer's log-probs equal to the engine's)."""
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Linear layers that get adapters, by the last part of their module name (Qwen2/Llama: attention and MLP projections); each must match a layer of the model, checked before any work."""


@dataclass
class ModelConfig:
    path: str = "tiny:h128-L8"
    """The policy: a local directory, a hub name, or ``tiny:<preset>`` for a tiny model built locally (e.g. ``tiny:h128-L8``)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Parameter dtype. float32 on CPU (bf16 autocast is ``trainer.bf16``); bfloat16 for large models on GPU."""
    tokenizer: str | None = None
    """Where the tokenizer comes from, whatever weights are loaded. None = the tokenizer saved with the weights (``model.path``, the warm start, a checkpoint)."""
    attn_implementation: str | None = None
    """Passed to transformers (``sdpa``, ``eager``, ``flash_attention_2``...). None = transformers' default."""
    ref_path: str | None = None
    """The frozen reference policy of the KL penalty (``algorithm.kl_coef`` > 0): a directory, hub name or ``tiny:PRESET``. None = the policy RL starts from (the warm start when ``sft.enabled``). Not loaded when ``kl_coef`` is 0."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory, ~30% more compute."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """Low-rank adapters instead of full fine-tuning (``rank`` > 0)."""


@dataclass
class EnvConfig:
    name: str = "calculator"
    """Environment registry name (``agentrl envs list``); checked against the registry when the run starts."""
    options: dict[str, Any] = field(default_factory=dict)
    """Values for the environment's options: class attributes it declares (``max_turns``, ``system_prompt``, its own), each set per run; an undeclared one, or a value of another type than the attribute's default, is an error before any work (docs/environments.md, "Options")."""
    module: str | None = None
    """Your own environment: a module name (``my_pkg.my_env``) or a ``.py`` file (relative paths are resolved against the current directory) imported before the run, so its ``@register`` runs."""


@dataclass
class DataConfig:
    source: Literal["builtin", "file", "hub"] = "builtin"
    """Where tasks come from: ``builtin`` = the environment's own generator (``Environment.load_tasks``), ``file`` = a local file, ``hub`` = a dataset name."""
    path: str | None = None
    """File path (``source: file``) or dataset name (``source: hub``); unused for ``builtin``."""
    adapter: str = "auto"
    """Dataset adapter turning rows into tasks (``auto``, ``jsonl``, ``gsm8k``, ``math500``, ``aime``, ``dapo_math``, ``verl``...); checked by the adapter registry when tasks load."""
    columns: dict[str, str] = field(default_factory=dict)
    """Map task fields (``id``, ``prompt``, ``answer``) to dataset columns, e.g. ``{prompt: question}``; empty = the adapter's defaults."""
    train_split: str = "train"
    """Split used for training: a hub split, or what ``{split}`` becomes in ``path``."""
    test_split: str = "test"
    """Split used for evaluation: a hub split, or what ``{split}`` becomes in ``path`` (or ``test_path``). The same as ``train_split`` (a hub dataset with one split) means one set of rows for both: see ``test_fraction``."""
    test_path: str | None = None
    """A file (or hub dataset) of its own for the held-out tasks (verl's ``data.val_files``); same ``source``, ``adapter`` and ``columns`` as ``path``. None = ``path`` with ``{split}`` set to ``test_split``."""
    test_fraction: float = knob(0.1, ge=0, lt=1)
    """When one set of rows serves both splits (``path`` without ``{split}`` and no ``test_path``, or ``train_split`` = ``test_split`` on the hub), this fraction of the rows (at least one) is held out for evaluation and never trained on, chosen by a permutation seeded by ``split_seed``; held-out rows whose prompt is also a training row's are dropped. 0 = no held-out tasks (training only; evaluation is then refused)."""
    split_seed: int = 0
    """Seed of the held-out split of one set of rows (``test_fraction``). Independent of ``run.seed``: runs with different seeds evaluate on the same held-out rows."""
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
class SyncConfig:
    bucket_mb: float = knob(256.0, gt=0)
    """Weight sync streams the new weights to the engine(s) in buckets of about this many MiB; the sender holds about one bucket beyond the model (a tensor larger than a bucket travels alone)."""
    verify: Literal["every", "first", "off"] = "every"
    """Prove what the engine serves: after a sync the engine returns checksums of a deterministic sample of every synced tensor's elements and the log-probs of a fixed probe sequence, and the trainer compares them with its own; a mismatch stops the run naming the tensors. ``first`` checks only the first sync of the process (the engine at version 0; after a resume too), ``off`` never."""
    probe_tokens: int = knob(32, ge=2)
    """Length of the probe sequence whose log-probs the engine and the trainer compare."""
    probe_atol: float | None = knob(None, gt=0)
    """Largest allowed |engine − trainer| probe log-prob difference. None = 1e-3 when the engine and the trainer's probe forward both compute in float32, 0.5 when either computes in a 16-bit dtype (a bfloat16 engine, FSDP2's bf16 mixed precision: on SmolLM2-135M a correct bf16 engine differs from the fp32 trainer by up to 0.36, measured by bench/bf16_numerics.py)."""
    transport: str = knob(OBJECT_STORE, choices=lambda: list(TRANSPORTS))
    """How the buckets reach Ray rollout workers (``rollout.workers`` > 0; with in-process engines any other than the default is an error); each is a registered transport (``agentrl/sync/registry.py``, one file in ``sync/transports/``): ``object_store`` = each bucket is put in Ray's object store once and every worker copies it (any placement); ``broadcast`` = a collective broadcast from the trainer (rank 0) to the workers (ranks 1..N) in a process group of the sync's own, built at the first sync from a TCPStore the trainer hosts (torch.distributed's default group is not touched): gloo when the trainer's weights are on the CPU, NCCL on a GPU, where every member needs a GPU of its own (NCCL refuses two ranks on one device). The group is rebuilt when a worker is replaced; its timeout is ``timeouts.weight_sync_s``, and the workers must join within half of it; ``cuda_ipc`` = the workers copy each bucket straight from the trainer's GPU memory through CUDA IPC handles (workers that share trainer rank 0's GPU, ``rollout.worker_gpus`` < 1 on a machine whose GPUs all hold a trainer rank). ``agentrl plan`` refuses a transport the placement cannot use. Which paths have run on a GPU: docs/scaling.md."""


@dataclass
class ColocateConfig:
    sleep: bool = False
    """Colocated engine memory: before each update the engine sleeps (frees its KV cache, ``sleep_level`` 2 also drops its weights) and wakes after it (weights, then sync, then KV cache). Needs an engine with sleep mode (``rollout.engine: vllm`` on a GPU) in the trainer's process (``rollout.workers: 0``); not with ``trainer.mode: async``."""
    sleep_level: int = knob(1, ge=1, le=2)
    """vLLM sleep level: 1 = offload weights to host memory and discard the KV cache; 2 = discard both (the sync refills the weights)."""


@dataclass
class ContextConfig:
    policy: Literal["stop", "compact", "window"] = "stop"
    """What happens when an episode's context could not hold another full turn (``max_tokens``): ``stop`` = the episode ends (stop reason ``token_budget``); ``compact`` = the policy writes a summary (a trained turn) and the episode goes on in a new sample whose prompt is the task, that summary and the latest observation; ``window`` = a new sample whose prompt drops the oldest whole turns. Every sample trains with the episode's advantage (docs/environments.md, "Episodes longer than the context")."""
    max_tokens: int | None = knob(None, ge=1)
    """The context budget the policy acts at: it acts after an observation when the context and another turn of ``rollout.max_tokens_per_turn`` would pass it. None = ``rollout.max_episode_tokens``, which stays the hard limit of every sample: with ``compact`` the summary request and the summary are written between the two (a summary that reaches the hard limit is cut there), so leave them room."""
    max_summary_tokens: int | None = knob(None, ge=1)
    """``compact``: new tokens of the summary turn. None = ``rollout.max_tokens_per_turn``."""
    summary_prompt: str | None = None
    """``compact``: the user message that asks for the summary. None = the environment's ``summary_prompt``, else agentrl's default."""


@dataclass
class RolloutConfig:
    engine: str = knob("hf", choices=lambda: list(ENGINES))
    """Generation backend (a record in ``agentrl/engines/registry.py``): ``hf`` = transformers in-process, ``vllm`` = vLLM (the ``vllm`` extra)."""
    dtype: Literal["float32", "bfloat16"] | None = None
    """The engine's weight dtype. None = ``model.dtype``; ``bfloat16`` with fp32 master weights (``trainer.bf16``) halves the engine's memory (vLLM on CPU always runs float32)."""
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
    stop: list[str] = field(default_factory=list)
    """Strings that end every policy turn, besides the end-of-turn token: the tokens up to and including the one that completes a string are kept, none after it (``Completion.stop_reason`` and the transcript's ``metrics.stop_reasons`` name it). Added to the environment's own (``env_stop``)."""
    env_stop: bool = True
    """Honour the environment's stop declarations (``Environment.stop_strings``, ``stop_conditions``): Short-CoT, Long-CoT, GSM-Symbolic and reasoning-gym end a turn with the token that closes its ``\\boxed{}`` answer, so no text is written, sampled or trained on after the answer (docs/environments.md, "When a turn ends"). False: a turn ends only at the end-of-turn token, ``rollout.stop`` or its token budget."""
    max_concurrent_episodes: int = knob(256, ge=1)
    """Episodes in flight at once per engine (others wait); also bounds open environments and sandbox sessions."""
    runner: Literal["lockstep", "async"] = "lockstep"
    """``lockstep`` = all active episodes generate a turn together, then all step; ``async`` = each episode asks for its next turn as soon as its observation is ready (continuous batching: a slow tool stalls only its own episode)."""
    workers: int = knob(0, ge=0)
    """Rollout workers: 0 = in-process; N = N Ray workers (trainer rank 0 owns them and runs every episode on them)."""
    worker_gpus: float | None = knob(None, ge=0)
    """GPUs each Ray worker asks Ray for, and gets as its ``CUDA_VISIBLE_DEVICES``: a fraction of one GPU (0.5: two workers share a GPU, or a worker shares the trainer's GPU when the trainer uses every GPU of the node) or a whole number (with vLLM, ``rollout.vllm.tensor_parallel_size``). None = 0 on a CPU run, else ``rollout.vllm.tensor_parallel_size`` with vLLM and 1 with the HF engine. A local Ray is given the node's GPUs no trainer rank uses (``agentrl plan`` prints the map)."""
    worker_placement: Literal["pack", "spread"] = "pack"
    """How the workers' bundles (one Ray placement group, a bundle ``{CPU: 1, GPU: worker_gpus}`` per worker) are placed: ``pack`` = on as few nodes as possible (Ray's PACK), ``spread`` = across nodes (Ray's SPREAD). A replaced worker takes its bundle, and so its GPUs, again."""
    ray_address: str | None = None
    """Ray cluster to join (``auto`` or ``ray://host:port``). None = start a local one when ``workers`` > 0."""
    max_staleness: int = knob(0, ge=0)
    """K: no episode trains when its oldest policy token was sampled more than K weight versions before the trainer's current weights (0 = fully on-policy). With ``trainer.mode: async`` it also bounds how far rollouts run ahead of training."""
    on_stale: Literal["wait", "drop"] = "wait"
    """Async mode: ``wait`` = rollouts never start an episode that could exceed ``max_staleness`` (the engine waits for weights); ``drop`` = rollouts run ahead up to the queue's capacity and episodes past the bound are dropped when the trainer takes them (the engine never waits for weights)."""
    train_on_truncated: bool = True
    """Train on episodes cut by a budget. False keeps them in group statistics but masks their tokens."""
    tools_prompt: Literal["auto", "system"] = "auto"
    """Where an environment's tool schemas are shown to the model. ``auto``: the chat template's own tools section when it has one (Qwen2.5, Llama-3, Qwen3 templates), else the system message, in agentrl's words with the environment's call format (SmolLM2's ChatML template has no tools section: without this they were dropped, never shown); ``system``: always the system message, also for a template that has a section (its call format may not be the one the environment parses). Either way the transcript holds what the model read (``metrics.tools_prompt``). ``python``-format tools (fenced code blocks) are described by the environment's own system prompt."""
    history: Literal["auto", "split", "merge"] = "auto"
    """When the chat template would show the model a different history than the one it wrote (a thinking template strips earlier ``<think>`` blocks): ``split`` = keep the model's own tokens in their sample and start a new sample, prompted with the template's render, where the served history differs; ``merge`` = one sample per episode, observations appended as deltas; ``auto`` = ``split`` when a probe of the template finds it strips thinking, else ``merge``. ``agentrl doctor`` prints the choice and why."""
    poll_every: int | None = knob(None, ge=1)
    """HF engine: its decode loop runs on the device and reads the newly sampled tokens back to the host every this many steps; stop strings, finished rows and dropping them from the batch are decided then, and tokens sampled past a row's end are discarded exactly. None = 1 on the CPU (a read costs nothing there), 8 on CUDA (a read waits for the GPU)."""
    cpu_gemm: Literal["mkl", "onednn", "auto"] = "auto"
    """HF engine on the CPU in float32: the library of the lean decode step's matrix products. ``auto`` (the default) = oneDNN where one layer's products measure at least 1.5x faster through it than through MKL, for models above hidden 256 (smaller ones keep ``mkl``, nothing measured); measured once per CPU model, torch version and thread count, and kept in ``$AGENTRL_CACHE/probes/cpu_gemm.json``. ``mkl`` = torch's float32 products (MKL on x86; the only path before oneDNN); ``onednn`` = oneDNN with each weight packed once per batch, and the lean step for every model it reproduces (2.5-3.3x the products' speed on a 2-core AVX-512 AMD EPYC where MKL ran a quarter of the machine's peak: docs/performance.md). The run prints its choice and why at the start (``HFEngine.cpu_gemm``, ``cpu_gemm_why``)."""
    lean_decode: bool | Literal["auto"] = "auto"
    """HF engine: its decode step. ``auto``: the lean step (engines/lean_decode.py) on CUDA, and on the CPU for small models (hidden up to 256), where its products go through oneDNN, or where it measures at least 1.1x faster than the transformers forward at the engine's start (kept per machine: engines/decode_probe.py); else the transformers forward. ``true``: the lean step, an error for a model it does not reproduce (Qwen2/Llama, full attention); ``false``: always the transformers forward. Same tokens either way, log-probs within 1e-5 in float32."""
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    """vLLM engine settings (used when ``engine: vllm``)."""
    sync: SyncConfig = field(default_factory=SyncConfig)
    """How new weights reach the engine(s), and the proof that they arrived."""
    colocate: ColocateConfig = field(default_factory=ColocateConfig)
    """An engine that shares the trainer's devices."""
    context: ContextConfig = field(default_factory=ContextConfig)
    """Episodes longer than the model's context: stop, compact (a trained summary) or window."""


@dataclass
class OverlongConfig:
    enabled: bool | None = None
    """DAPO's soft overlong punishment added to the reward (docs/algorithms.md, "Policy loss"). None = from the preset."""
    max_length: int | None = knob(None, ge=1)
    """L_max in policy tokens per episode. None = min(max_turns × max_tokens_per_turn, max_episode_tokens)."""
    cache_length: int | None = knob(None, ge=1)
    """L_cache, the buffer before L_max where the penalty ramps to -1. None = max_length / 5 (DAPO: 4096 of 20480)."""


@dataclass
class AlgorithmConfig(HasSections):
    name: str = knob("grpo", choices=lambda: list(registry.METHODS))
    """The method: picks the token weighting and the defaults of the preset fields (table below)."""
    advantage: str | None = knob(None, choices=lambda: list(registry.ADVANTAGES))
    """Group advantage estimator. None = from the preset."""
    loss_agg: str | None = knob(None, choices=lambda: list(registry.AGGREGATIONS))
    """How per-token losses are averaged (docs/algorithms.md, "Policy loss"). None = from the preset."""
    clip_low: float | None = knob(None, ge=0, lt=1)
    """ε_low: the ratio is clipped below at 1 − ε_low. None = from the preset."""
    clip_high: float | None = knob(None, ge=0)
    """ε_high: the ratio is clipped above at 1 + ε_high. None = from the preset."""
    ratio_clip: bool | None = None
    """Apply the PPO ratio clip at all (KL-Cov does not). None = from the preset."""
    dual_clip: float | None = knob(3.0, gt=1)
    """Dual-clip constant c bounding the loss of negative-advantage tokens; None disables it."""
    kl_coef: float = knob(0.0, ge=0)
    """β of the KL penalty to the frozen reference policy (``model.ref_path``); 0 = no penalty, and no reference model is loaded."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """Per-token KL estimator: ``k1`` = log π − log π_ref, ``k2`` = ½(log π − log π_ref)², ``k3`` = e^(log π_ref − log π) − (log π_ref − log π) − 1 (GRPO's low-variance one)."""
    kl_in: Literal["loss", "reward"] = "loss"
    """Where the penalty goes: ``loss`` adds β·Agg(KL) to the loss (GRPO; verl ``use_kl_loss``); ``reward`` subtracts β·Σ KL over each episode's policy tokens from its reward before the advantages (verl ``use_kl_in_reward``)."""
    entropy_coef: float = knob(0.0, ge=0)
    """β_H of the entropy bonus; 0 = off."""
    dynamic_sampling: bool | None = None
    """Drop groups whose rewards are all equal and sample more until the batch is full. None = from the preset."""
    max_sampling_rounds: int = knob(4, ge=1)
    """Generation rounds per step with dynamic sampling before training on what there is."""
    void_turn_masking: bool | None = None
    """Episodes with a turn that has neither a tool call nor an answer keep their reward but get no gradient (SimpleTIR). None = on for multi-turn runs (``rollout.max_turns`` > 1), off for single-turn ones, where a response with no answer is a wrong answer and is trained on as one (as in DAPO and STARE)."""
    overlong: OverlongConfig = field(default_factory=OverlongConfig)
    """Soft overlong punishment."""
    is_correction: Literal["none", "tis"] = "none"
    """Importance-sampling correction for rollout/trainer mismatch: ``tis`` = truncated IS weights."""
    is_cap: float = knob(2.0, ge=1)
    """Cap C of the truncated importance weights."""
    settings: dict[str, Any] = registered_sections(registry.settings_types)  # noqa: RUF009  (a field())
    """Each token weighting's settings, as ``algorithm.<name>`` (``stare``, ``steer``, ``stapo``, ``clip_cov``, ``kl_cov``, ``high_entropy``, and any registered later); defined in the method's module."""


@dataclass
class FSDPConfig:
    replicas: int = knob(1, ge=1)
    """HSDP: split the ranks into this many groups (usually the number of nodes); parameters are sharded within a group and replicated across groups. 1 = plain FSDP over all ranks. Must divide the world size (checked before any work)."""
    cpu_offload: bool = False
    """Keep the parameter shards, gradients and optimizer states in host memory (FSDP2 ``CPUOffloadPolicy``); the optimizer step runs on the CPU. Less GPU memory, slower steps."""
    grad_reduce: Literal["step", "micro_batch"] = "step"
    """When gradients are reduce-scattered: ``step`` = once per optimizer step (between micro-batches each rank accumulates unsharded fp32 gradients, 4 bytes per trainable parameter); ``micro_batch`` = after every micro-batch (the accumulation stays sharded: less memory, more communication). The same update either way."""
    reshard_after_forward: bool = True
    """Free each decoder layer's gathered parameters after its forward and gather them again for the backward (ZeRO-3); False keeps them from forward to backward (ZeRO-2: one all-gather less per layer, more memory)."""


@dataclass
class TrainerConfig:
    total_steps: int = knob(200, ge=1)
    """Training steps (one step = one batch of rollouts and its updates)."""
    lr: float = knob(1e-6, gt=0, le=1)
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
    mode: Literal["sync", "async"] = "sync"
    """``sync`` = each step's rollouts use the newest weights and the update waits for them; ``async`` = rollouts keep running while the trainer updates (finished episodes queue for the next step, an episode in flight takes the new weights at its next turn), bounded by ``rollout.max_staleness``."""
    mini_batches_per_step: int = knob(1, ge=1)
    """Optimizer updates per step; the step's groups are split evenly between them."""
    epochs_per_step: int = knob(1, ge=1)
    """Passes over the step's batch."""
    strategy: Literal["ddp", "fsdp2"] = "ddp"
    """How the policy is spread over data-parallel ranks (torchrun): ``ddp`` = every rank holds the whole model, gradients and optimizer states; ``fsdp2`` = FSDP2 shards all three over the ranks (docs/scaling.md). One process: ``ddp`` is plain training, ``fsdp2`` shards over one rank (for CPU offload)."""
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP2 settings (``strategy: fsdp2``)."""
    micro_batch_size: int = knob(8, ge=1)
    """Episodes per forward/backward; gradients accumulate up to a mini-batch (same result at any size)."""
    chunked_head: Literal["auto", "always", "never"] = "auto"
    """Token log-probs and entropies from the last hidden states, the output head applied a chunk of positions at a time, so the [B, T, V] logits never exist whole, in the forward or the backward (at a 151 k vocabulary, 8 k tokens of logits take 5 GB in fp32 and their gradient as much again). ``auto``: on from a 32 k vocabulary when the head allows it (a plain linear head; not under FSDP2, whose root gathers the head only inside the model's forward); ``always``: an error where the head does not allow it; ``never``: the whole logits."""
    share_prefix: bool = True
    """Run the prompt prefix a micro-batch shares (system prompt, tool schemas) once per forward instead of once per episode: same losses and gradients, less compute. Off in the gradient pass under DDP and gradient checkpointing, and in every pass under FSDP2."""
    bf16: bool | Literal["auto"] = "auto"
    """bf16 compute in forward/backward: autocast with ``ddp``; FSDP2's mixed precision (bf16 parameters for compute, fp32 gradient reduction and master weights) with ``fsdp2``. ``auto`` (the default) takes bf16 only where the device computes it natively (a GPU, or a CPU with AVX-512 BF16, AMX or Arm BF16; elsewhere torch emulates it many times slower), ``algorithm.is_correction`` is ``tis`` (bf16 moves the rollout/trainer gap from 1e-5 to about 0.03 a token), the model is above hidden 256, a layer's products measure at least 1.3x faster in bf16 (CPU), and the measured log-prob gap on the model stays inside ``rollout.sync.probe_atol``; else float32. The run prints the choice and why (assembly/precision.py). ``true``/``false`` decide without measuring."""
    checkpoint_every: int = knob(0, ge=0)
    """Save a checkpoint every N steps; 0 = only at the end."""
    keep_checkpoints: int = knob(2, ge=1)
    """How many recent checkpoints to keep."""
    eval_every: int = knob(0, ge=0)
    """Evaluate every N steps; 0 = off."""
    max_failed_fraction: float | None = knob(0.5, gt=0, le=1)
    """Circuit breaker: stop the run with an error (the boundary, the message, an example episode) when more than this fraction of a step's episodes fail (an exception at the model, tool, sandbox, env or reward boundary) for ``max_failed_steps`` steps in a row. None = never stop."""
    max_failed_steps: int = knob(3, ge=1)
    """Consecutive steps over ``max_failed_fraction`` that stop the run."""
    max_wall_minutes: float | None = knob(None, gt=0)
    """Stop (after a checkpoint) once this much wall time has passed; None = no limit."""

    @property
    def computes_bf16(self) -> bool:
        """``bf16`` once decided: ``auto`` is replaced by the choice at the run's start (assembly/precision.py)."""
        if self.bf16 == "auto":
            raise RuntimeError(
                "trainer.bf16=auto reached the trainer undecided: assembly/precision.resolved decides it"
            )
        return self.bf16


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
    lr: float = knob(1e-5, gt=0, le=1)
    """Learning rate (tiny models trained from scratch need ~1e-3)."""
    batch_size: int = knob(16, ge=1)
    """Demonstrations per step."""
    micro_batch_size: int | None = knob(None, ge=1)
    """Demonstrations per forward: a step's batch runs in forwards of this many, their gradients accumulated (the same update; the activations of one micro-batch at a time). None = the whole batch in one forward. ``model.gradient_checkpointing`` applies to SFT too."""
    cache: bool = True
    """Keep the warm start in the cache (``$AGENTRL_CACHE``, default ``~/.cache/agentrl``) and reuse one made earlier with the same model, demonstrations and settings. False = nothing is written to the cache: the warm start goes into the run directory (``warm_start/``)."""
    seed: int | None = None
    """Seed of the warm start (demonstrations, their order, the SFT run); None = ``run.seed``. Fix it to share one warm start across RL seeds, as ``agentrl study`` does."""
    exclude_train_seeds: list[int] = field(default_factory=list)
    """Keep the demonstrations off RL's training tasks: demonstrations are then drawn from a separate task stream, minus every task whose prompt is among the training tasks RL draws with these run seeds. Empty = demonstrations come from the training tasks of the SFT seed (the default; with a small problem space the warm start can then memorise the problems RL trains on)."""
    num_tasks: int | None = knob(None, ge=1)
    """Distinct training tasks the demonstrations are drawn from; None = ``data.num_train``. With ``exclude_train_seeds``, a pool larger than RL's task list leaves more tasks once RL's are removed."""
    holdout: float = knob(0.0, ge=0, lt=1)
    """Fraction of the demonstrations held out of training (0 = none). With a held-out set, its loss is measured every ``eval_every`` steps, the weights with the lowest held-out loss are kept, and ``patience`` can stop training early: a warm start that keeps the demonstrations' diversity instead of memorising their prompts."""
    eval_every: int = knob(50, ge=1)
    """Steps between held-out evaluations. Needs ``holdout`` > 0 (another value without it is a config error)."""
    patience: int = knob(0, ge=0)
    """Stop after this many held-out evaluations without a new lowest loss (0 = run every step, still keeping the best weights). Needs ``holdout`` > 0."""
    weights: Literal["auto", "lora", "full"] = "auto"
    """Which weights the warm start trains. ``lora``: adapters with ``model.lora``'s settings, merged into the base when SFT ends (the warm start is a plain model; RL then adds fresh adapters on it, and its KL reference with LoRA is that warm start); only the adapters and their AdamW moments are trained, so SFT fits where LoRA's RL does. ``full``: every weight (AdamW moments for all of them: ``agentrl plan`` counts it). ``auto``: ``lora`` when ``model.lora.rank`` > 0, else ``full``."""


@dataclass
class EvalConfig:
    k: int = knob(8, ge=1)
    """Samples per task; reports mean@k and pass@k."""
    num_tasks: int | None = knob(None, ge=1)
    """Tasks to evaluate; None = all loaded held-out tasks (``data.num_test``)."""
    temperature: float = knob(1.0, ge=0)
    """Sampling temperature; 0 = greedy."""
    top_p: float = knob(1.0, gt=0, le=1)
    """Nucleus sampling at evaluation: the smallest set of tokens whose probability reaches ``top_p``
    (1 = off). The STARE paper evaluates at 0.7."""
    split: Literal["train", "test"] = "test"
    """Which task set to evaluate on: ``test`` = ``data.test_split``, ``train`` = ``data.train_split``."""


@dataclass
class Config:
    __foreign_keys__: ClassVar[dict[str, str]] = {
        "data.train_files": "data.path (with data.source: file)",
        "data.val_files": "data.test_path",
        "data.test_files": "data.test_path",
        "data.train_batch_size": "rollout.prompts_per_step",
        "data.prompt_key": "data.columns (e.g. {prompt: my_column})",
    }
    """Keys users bring from other frameworks (verl's data section), with the key that does the same
    here: an unknown-key error points to it."""

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
    timeouts: TimeoutsConfig = field(default_factory=TimeoutsConfig)
    """How long anything may wait before it raises an error naming what it waited for."""
    proxy: ProxyConfig = field(default_factory=ProxyConfig)
    """The OpenAI-compatible endpoint agents call (``AgentEnvironment``, ``agentrl serve``)."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """What the run records."""


# ------------------------------------------------------------------------------ read from a Config
def output_dir(cfg: Config) -> Path:
    """The run's directory: ``run.output_dir``, or ``runs/<run.name>`` when that is unset."""
    return Path(cfg.run.output_dir or f"runs/{cfg.run.name}")


def weighting_name(cfg: Config) -> str:
    """The token weighting ``algorithm.name`` trains with (``none`` for the plain surrogate)."""
    return registry.METHODS[cfg.algorithm.name].weighting


def weighting_settings(cfg: Config) -> Any:
    """That weighting's settings section (``cfg.algorithm.stare`` for STARE), or None."""
    return cfg.algorithm.settings.get(weighting_name(cfg))
