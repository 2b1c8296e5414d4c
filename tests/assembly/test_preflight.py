"""Bad input a user can give ``agentrl train`` (and eval, rollout, sft, serve, envs check) is a
config error before any work: exit 2, one message naming the key or the file and line, what was
found and what to do, and no run directory. Each case here was a raw traceback before
(issue 28), most of them after the run directory and its config.yaml had been written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from agentrl.cli import main
from tests.helpers import HELPERS, ROOT

ENVS = str(HELPERS / "preflight_envs.py")


def refused(
    tmp_path: Path, capsys, *args: str, command: str = "train", config: str = "configs/quickstart.yaml"
) -> str:
    """Run ``agentrl COMMAND CONFIG ARGS`` and return its error; it must exit 2 without creating the
    run directory."""
    run = tmp_path / "run"
    code = main([command, str(ROOT / config), f"run.output_dir={run}", *args])
    err = capsys.readouterr().err
    assert code == 2, err
    assert not run.exists(), f"{command} created {run} before failing"
    return err


def qa_file(tmp_path: Path, text: str | None = None, name: str = "mine.jsonl") -> Path:
    path = tmp_path / name
    rows = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(20)]
    path.write_text(text if text is not None else "".join(json.dumps(r) + "\n" for r in rows))
    return path


OWN = "configs/examples/own_data_cpu.yaml"  # short_cot on a data file, SFT on


def own_data(path: Path, *more: str) -> list[str]:
    return [f"data.path={path}", *more]


# -- the model and the device ---------------------------------------------------------------------
def test_a_model_path_that_does_not_exist(tmp_path, capsys):
    err = refused(tmp_path, capsys, f"model.path={tmp_path}/models/mine", "sft.enabled=false")
    assert f"model.path='{tmp_path}/models/mine': no such directory" in err and "tiny:h128-L8" in err


def test_a_model_directory_without_config_json_or_tokenizer(tmp_path, capsys):
    (tmp_path / "m").mkdir()
    err = refused(tmp_path, capsys, f"model.path={tmp_path / 'm'}", "sft.enabled=false")
    assert "has no config.json: not a Hugging Face model directory" in err
    assert "holds no tokenizer" in err and "model.tokenizer" in err


def test_a_hub_name_that_the_hub_cannot_give(tmp_path, capsys, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # read when huggingface_hub is imported (earlier tests did): without this, ~25 s of retries
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    err = refused(tmp_path, capsys, "model.path=nobody/no-such-model", "sft.enabled=false")
    assert "model.path='nobody/no-such-model': no such local directory, and the hub did not give it" in err


def test_a_tiny_preset_that_does_not_exist(tmp_path, capsys):
    err = refused(tmp_path, capsys, "model.path=tiny:h999", "sft.enabled=false")
    assert "no such tiny preset; valid: tiny:h128-L8" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_on_a_machine_without_it(tmp_path, capsys):
    err = refused(tmp_path, capsys, "run.device=cuda", "sft.enabled=false")
    assert "run.device=cuda, but torch" in err and "sees no CUDA device" in err and "run.device=auto" in err


# -- data files ------------------------------------------------------------------------------------
def test_a_data_file_that_does_not_exist(tmp_path, capsys):
    err = refused(tmp_path, capsys, *own_data(tmp_path / "nope.jsonl"), "sft.enabled=false", config=OWN)
    assert f"dataset file {tmp_path / 'nope.jsonl'} does not exist" in err


def test_a_malformed_jsonl_file_names_the_file_and_line(tmp_path, capsys):
    path = qa_file(tmp_path, '{"question": "a", "answer": "1"}\n{"question": "b", answer: 2}\n')
    err = refused(tmp_path, capsys, *own_data(path), "sft.enabled=false", config=OWN)
    assert f"{path}, line 2: not JSON (Expecting property name enclosed in double quotes" in err


def test_a_data_or_demonstration_file_that_is_not_utf8_names_the_file_and_line(tmp_path, capsys):
    """Before: a bare ``UnicodeDecodeError`` naming neither the file nor the line."""
    from agentrl.env.demos import load_demonstrations

    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"question": "a", "answer": "1"}\n{"question": "caf\xe9", "answer": "2"}\n')
    err = refused(tmp_path, capsys, *own_data(path), "sft.enabled=false", config=OWN)
    assert f"{path}, line 2, column 18: not UTF-8 (byte 0xe9): save the file as UTF-8" in err
    demos = tmp_path / "demos.jsonl"
    demos.write_bytes(b'[{"role": "user", "content": "caf\xe9"}]\n')
    with pytest.raises(ValueError, match=r"demos\.jsonl, line 1, column 34: not UTF-8 \(byte 0xe9\)"):
        load_demonstrations(demos)


def test_a_row_without_an_answer_names_the_line(tmp_path, capsys):
    path = qa_file(tmp_path, '{"question": "a", "answer": "1"}\n\n{"question": "b"}\n')
    err = refused(tmp_path, capsys, *own_data(path, "data.test_fraction=0"), "sft.enabled=false", config=OWN)
    assert f"{path}, line 3: column 'answer' not found" in err


def test_a_csv_that_cannot_be_read_names_the_file(tmp_path, capsys):
    path = tmp_path / "mine.csv"
    path.write_bytes(b'question,answer\n"unclosed,1\n')
    err = refused(tmp_path, capsys, *own_data(path), "sft.enabled=false", config=OWN)
    assert f"{path}: cannot be read as csv" in err or "cannot pick an adapter" in err


def test_verl_key_names_point_to_ours(tmp_path, capsys):
    err = refused(tmp_path, capsys, "data.train_files=mine.jsonl", "data.val_files=test.jsonl")
    assert "unknown key 'data.train_files' — agentrl calls it data.path (with data.source: file)" in err
    assert "unknown key 'data.val_files' — agentrl calls it data.test_path" in err


def test_evaluation_with_nothing_held_out_is_refused(tmp_path, capsys):
    err = refused(tmp_path, capsys, *own_data(qa_file(tmp_path), "data.test_fraction=0"), "sft.enabled=false",
                  command="eval", config=OWN)  # fmt: skip
    assert "no held-out tasks" in err and "data.test_path" in err


# -- the environment and its tasks ---------------------------------------------------------------
def test_an_undeclared_environment_option(tmp_path, capsys):
    err = refused(tmp_path, capsys, "env.options.mode=1", "sft.enabled=false")
    assert "env.options: environment 'calculator' (Calculator) has no option 'mode'" in err
    assert "Its options: extra_tools, max_turns, max_value, mcp_servers, n_operands" in err
    assert "declare `mode = ...` in the class body" in err


def test_a_generator_knob_that_does_not_exist(tmp_path, capsys):
    err = refused(
        tmp_path,
        capsys,
        "data.options={mode: hard}",
        "sft.enabled=false",
        config="configs/short_cot_cpu.yaml",
    )
    assert "the task generator of environment 'short_cot' does not take them" in err and "'mode'" in err


def test_generator_knobs_left_over_for_a_data_file(tmp_path, capsys):
    """The quickstart's calculator knobs, kept when the user switches to a file: they do not apply."""
    err = refused(tmp_path, capsys, "env.name=short_cot", "data.source=file", f"data.path={qa_file(tmp_path)}",
                  "sft.enabled=false")  # fmt: skip
    assert "data.options ['max_value', 'n_operands'] do not apply to the 'jsonl' dataset adapter" in err


def test_an_environment_without_built_in_tasks(tmp_path, capsys):
    err = refused(tmp_path, capsys, f"env.module={ENVS}", "env.name=preflight_no_tasks", "data.options={}",
                  "sft.enabled=false")  # fmt: skip
    assert "environment 'preflight_no_tasks' has no built-in tasks: set data.source=file" in err


@pytest.mark.parametrize(("kind", "said"), [("dicts", "returned dict"), ("empty", "gave no train tasks")])
def test_load_tasks_that_returns_no_tasks(tmp_path, capsys, kind, said):
    err = refused(tmp_path, capsys, f"env.module={ENVS}", "env.name=preflight_bad_tasks",
                  f"data.options={{kind: {kind}}}", "sft.enabled=false")  # fmt: skip
    assert said in err


def test_an_environment_whose_constructor_raises(tmp_path, capsys):
    err = refused(tmp_path, capsys, f"env.module={ENVS}", "env.name=preflight_broken_init", "data.options={}",
                  "sft.enabled=false")  # fmt: skip
    assert (
        "env: constructing 'preflight_broken_init'" in err
        and "RuntimeError: cannot reach the simulator" in err
    )


# -- the SFT warm start ---------------------------------------------------------------------------
def test_sft_for_an_environment_without_demonstrations(tmp_path, capsys):
    path = qa_file(tmp_path)
    err = refused(
        tmp_path, capsys, f"env.module={ENVS}", *own_data(path), "env.name=preflight_no_tasks", config=OWN
    )
    assert "sft.enabled=true, but environment 'preflight_no_tasks' has no solver demonstrations" in err
    assert "sft.demos" in err and "sft.enabled=false" in err


def test_sft_on_rows_without_a_solution(tmp_path, capsys):
    err = refused(tmp_path, capsys, *own_data(qa_file(tmp_path)), config=OWN)
    assert "has neither solver terms nor a reference solution" in err
    assert "need a `solution` column" in err and "sft.demos" in err


def test_sft_command_and_rollout_command_check_first_too(tmp_path, capsys):
    assert "has neither solver terms" in refused(
        tmp_path, capsys, *own_data(qa_file(tmp_path)), command="sft", config=OWN
    )
    assert "has no option 'mode'" in refused(tmp_path, capsys, "env.options.mode=1", command="rollout")
    assert "no such directory" in refused(tmp_path, capsys, f"model.path={tmp_path}/x", command="serve")


# -- envs check ------------------------------------------------------------------------------------
def test_envs_check_with_an_undeclared_or_malformed_option(capsys):
    assert main(["envs", "check", "calculator", "--options", '{"mode": 1}']) == 2
    assert "--options: environment 'calculator' (Calculator) has no option 'mode'" in capsys.readouterr().err
    assert main(["envs", "check", "calculator", "--options", "{mode: 1}"]) == 2
    assert "--options must be a JSON object" in capsys.readouterr().err


def test_all_problems_are_reported_at_once(tmp_path, capsys):
    err = refused(tmp_path, capsys, f"model.path={tmp_path}/x", "env.options.mode=1")
    assert "2 problems in the config" in err


# -- found by the audit of every exception user input reached before step 0 ------------------------
def model_dir(tmp_path: Path, tiny_model_dir: Path, drop: tuple[str, ...] = (), name: str = "m") -> Path:
    import shutil

    out = tmp_path / name
    shutil.copytree(tiny_model_dir, out)
    for f in drop:
        (out / f).unlink()
    return out


def test_model_directories_that_are_not_models(tmp_path, tiny_model_dir, capsys):
    run_like = tmp_path / "a_run"
    (run_like / "checkpoints").mkdir(parents=True)
    (run_like / "config.yaml").write_text("run: {}\n")
    err = refused(tmp_path, capsys, f"model.path={run_like}", "sft.enabled=false")
    assert "is an agentrl run directory: use one of its checkpoints" in err
    lora = tmp_path / "lora_ckpt"
    (lora / "adapter").mkdir(parents=True)
    assert "is a LoRA checkpoint (adapters only): `agentrl export" in refused(
        tmp_path, capsys, f"model.path={lora}", "sft.enabled=false"
    )
    typeless = model_dir(tmp_path, tiny_model_dir, name="typeless")
    cfg = json.loads((typeless / "config.json").read_text())
    del cfg["model_type"]
    (typeless / "config.json").write_text(json.dumps(cfg))
    assert "has no model_type" in refused(tmp_path, capsys, f"model.path={typeless}", "sft.enabled=false")


def test_a_tokenizer_without_a_chat_template_says_how_to_supply_one(tmp_path, tiny_model_dir, capsys):
    plain = model_dir(tmp_path, tiny_model_dir, drop=("chat_template.jinja",))
    tc = json.loads((plain / "tokenizer_config.json").read_text())
    tc.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(tc))
    err = refused(tmp_path, capsys, f"model.path={plain}", "sft.enabled=false")
    assert "its tokenizer has no chat template" in err and "chat_template.jinja" in err


def test_machine_settings_checked_before_any_work(tmp_path, capsys, monkeypatch):
    import importlib.util

    args = ["model.attn_implementation=flash_attention_9", "logging.wandb=true", "rollout.engine=vllm",
            "rollout.workers=1", "rollout.ray_address=127.0.0.1:1", "sft.enabled=false"]  # fmt: skip
    monkeypatch.setenv("AGENTRL_CACHE", "/proc/agentrl-cache")
    err = refused(tmp_path, capsys, *args)
    assert "model.attn_implementation='flash_attention_9': valid: eager, sdpa" in err
    assert "the cache directory /proc/agentrl-cache (AGENTRL_CACHE) cannot be created" in err
    assert "rollout.ray_address='127.0.0.1:1': nothing answers there" in err
    if importlib.util.find_spec("wandb") is None:
        assert "logging.wandb=true needs the 'wandb' package, which is not installed here" in err
    if importlib.util.find_spec("vllm") is None:  # the engine's record says so (its install_check)
        assert "rollout.engine=vllm: the 'vllm' package is not installed here: pip install vllm" in err


def test_run_directories_that_cannot_be_made(tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for out, said in ((a_file, "is a file, not a directory"), (a_file / "run", "is a file"),
                      (Path("/proc/agentrl_run"), "cannot be created or written")):  # fmt: skip
        assert (
            main(
                ["train", str(ROOT / "configs/quickstart.yaml"), f"run.output_dir={out}", "sft.enabled=false"]
            )
            == 2
        )
        assert said in capsys.readouterr().err


def test_endpoints_that_cannot_listen(tmp_path, capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        err = refused(tmp_path, capsys, "sft.enabled=false", "--port", str(port), command="serve")
        assert f"--host/--port: cannot listen on 127.0.0.1:{port}: the port is in use" in err
    err = refused(tmp_path, capsys, "env.name=arithmetic_agent", f"env.module={ROOT}/docs/examples/agent_env.py",
                  "proxy.host=203.0.113.5", "sft.enabled=false", "data.options={}")  # fmt: skip
    assert "proxy.host/proxy.port: cannot listen on 203.0.113.5:0" in err


@pytest.mark.parametrize(
    ("content", "name", "said"),
    [
        (None, "dir.jsonl", "is a directory: data.path names a file"),
        ("", "empty.jsonl", "has no rows"),
        ('{"question": null, "answer": "1"}\n', "nullq.jsonl", "line 1: the prompt is empty or missing"),
        ('{"question": "a", "answer": null}\n', "nulla.jsonl", "line 1: the answer is missing"),
        ('{"text": "a", "label": 1}\n', "cols.jsonl", "cannot pick an adapter for columns ['label', 'text']"),
    ],
)
def test_data_files_that_hold_no_tasks(tmp_path, capsys, content, name, said):
    path = tmp_path / name
    path.mkdir() if content is None else path.write_text(content)
    err = refused(tmp_path, capsys, *own_data(path, "data.test_fraction=0"), "sft.enabled=false", config=OWN)
    assert said in err


def test_other_data_settings(tmp_path, capsys):
    path = qa_file(tmp_path)
    assert "unknown adapter 'gsm8kk' (did you mean 'gsm8k'?)" in refused(
        tmp_path, capsys, *own_data(path, "data.adapter=gsm8kk"), "sft.enabled=false", config=OWN
    )
    lang = str(tmp_path / "{lang}.jsonl")
    assert "{lang}.jsonl does not exist" in refused(
        tmp_path, capsys, *own_data(lang), "sft.enabled=false", config=OWN
    )
    err = refused(tmp_path, capsys, f"data.path={path}", "sft.enabled=false")  # forgot data.source=file
    assert "data.path is set, but data.source=builtin takes the environment's own tasks and ignores it" in err


def test_generator_knobs_of_the_calculator(tmp_path, capsys):
    assert "calculator's tasks take n_operands, max_value and teacher, not mode" in refused(
        tmp_path, capsys, "data.options.mode=1", "sft.enabled=false"
    )
    assert "found only" in refused(
        tmp_path, capsys, "data.options.max_value=3", "data.num_train=500", "sft.enabled=false"
    )
    assert "needs n_operands >= 1 and max_value >= 2" in refused(
        tmp_path, capsys, "data.options.n_operands=0", "sft.enabled=false"
    )


@pytest.mark.parametrize(
    ("lines", "said"),
    [
        ([], "holds no demonstration"),
        ([[{"role": "user", "content": "hi"}]], "line 1: no assistant message"),
        (
            [[{"role": "user", "content": "hi"}, {"role": "bot", "content": "x"}]],
            "line 1: message 1 has role 'bot'",
        ),
        ([[{"role": "assistant", "content": "x"}]], "line 1: starts with an assistant message"),
    ],
)
def test_demonstration_files_that_teach_nothing(tmp_path, capsys, lines, said):
    demos = tmp_path / "demos.jsonl"
    demos.write_text("".join(json.dumps(d) + "\n" for d in lines))
    assert said in refused(tmp_path, capsys, f"sft.demos={demos}")


def test_an_sft_holdout_that_leaves_nothing_to_train_on(tmp_path, capsys):
    demos = tmp_path / "demos.jsonl"
    demos.write_text(
        json.dumps([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "1"}]) + "\n"
    )
    err = refused(tmp_path, capsys, f"sft.demos={demos}", "sft.holdout=0.5", "sft.eval_every=10")
    assert "sft.holdout=0.5 holds out all 1 demonstration(s)" in err


def test_load_tasks_that_returns_none(tmp_path, capsys):
    err = refused(tmp_path, capsys, f"env.module={ENVS}", "env.name=preflight_bad_tasks",
                  "data.options={kind: none}", "sft.enabled=false")  # fmt: skip
    assert "returned NoneType, not a list of Task" in err


def test_envs_check_module_and_constructor_errors(capsys):
    assert main(["envs", "check", "x", "--module", "no/such/file.py"]) == 2
    assert "--module 'no/such/file.py' cannot be imported: FileNotFoundError" in capsys.readouterr().err
    assert main(["envs", "check", "preflight_broken_init", "--module", ENVS]) == 1
    assert (
        "FAIL  constructing the environment raised RuntimeError: cannot reach the simulator"
        in capsys.readouterr().out
    )


def test_eval_of_a_checkpoint_that_does_not_exist_and_rollout_of_no_tasks(tmp_path, capsys):
    err = refused(
        tmp_path, capsys, "--checkpoint", str(tmp_path / "step_99"), "sft.enabled=false", command="eval"
    )
    assert "--checkpoint" in err and "not a model directory" in err
    with pytest.raises(SystemExit):
        main(["rollout", str(ROOT / "configs/quickstart.yaml"), "--tasks", "0"])
    assert "must be at least 1" in capsys.readouterr().err


def test_run_threads_reaches_torch_and_a_busy_machine_is_pointed_out(monkeypatch):
    from agentrl.assembly import components
    from agentrl.config import load_config

    before = torch.get_num_threads()
    try:
        components.apply_threads(load_config(None, ["run.threads=1"]))
        assert torch.get_num_threads() == 1
        torch.set_num_threads(os.cpu_count() or 1)
        said: list[str] = []
        monkeypatch.setattr(os, "getloadavg", lambda: (1.9, 1.0, 1.0))
        components.apply_threads(load_config(None, ["run.device=cpu"]), said.append)
        assert said and "this machine is busy (load 1.9" in said[0] and "run.threads" in said[0]
        monkeypatch.setattr(os, "getloadavg", lambda: (0.1, 0.1, 0.1))
        said.clear()
        components.apply_threads(load_config(None, ["run.device=cpu"]), said.append)
        assert said == []
    finally:
        torch.set_num_threads(before)


def test_an_option_value_of_the_wrong_type(tmp_path, capsys):
    """Before: it passed every check, then crashed in the runner (str < int) after the warm start."""
    err = refused(tmp_path, capsys, "env.options.max_turns=abc", "sft.enabled=false")
    assert "option 'max_turns' takes a value of type int, like its default 4; got 'abc' (str)" in err


def test_resume_arguments_that_cannot_be_a_run(tmp_path, capsys):
    assert main(["train", "--resume", str(tmp_path / "nope")]) == 2
    assert "no such directory; --resume takes a run directory" in capsys.readouterr().err
    assert main(["train", "--resume", str(ROOT / "configs/quickstart.yaml")]) == 2
    assert "a file; --resume takes a run directory" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path), "--overwrite"]) == 2
    assert "give one of them" in capsys.readouterr().err


def test_a_prompt_longer_than_the_episode_budget_is_named(tmp_path, tiny_model_dir, capsys):
    """Before: 'no group had rewards that differ ... check the warm start', the wrong cause."""
    code = main(["train", str(ROOT / "configs/quickstart.yaml"), f"model.path={tiny_model_dir}", "sft.enabled=false",
                 f"run.output_dir={tmp_path / 'run'}", "rollout.max_episode_tokens=36", "rollout.max_tokens_per_turn=16",
                 "trainer.total_steps=1", "logging.plots=false", "logging.tensorboard=false"])  # fmt: skip
    out = capsys.readouterr()
    assert code == 3
    assert (
        "the prompt (system prompt, tool schemas, task) is longer than rollout.max_episode_tokens=36"
        in out.err
    )


def test_bf16_on_a_cpu_without_bf16_instructions_is_said():
    """On an AVX2 CPU torch emulates bf16 products: trainer.bf16 made a step slower, not faster."""
    from agentrl.assembly import components
    from agentrl.config import load_config

    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    avx2, bf16_cpu = {"fpu", "avx2", "fma"}, {"avx2", "avx512f", "avx512_bf16"}
    bf16 = load_config(None, ["trainer.bf16=true", "rollout.dtype=bfloat16"])
    note = components.cpu_bf16_note(bf16, cpu, avx2)
    assert note and "trainer.bf16, rollout.dtype=bfloat16 on a CPU without bf16 instructions" in note
    assert components.cpu_bf16_note(bf16, cpu, bf16_cpu) is None
    assert components.cpu_bf16_note(bf16, cpu, {"fp", "asimd", "bf16"}) is None  # Arm's flag
    assert components.cpu_bf16_note(bf16, gpu, avx2) is None
    assert components.cpu_bf16_note(load_config(None, ["trainer.bf16=false"]), cpu, avx2) is None  # float32
    assert components.cpu_bf16_note(bf16, cpu, set()) is None  # flags unknown: no guess
    assert isinstance(components.cpu_flags(), set)
