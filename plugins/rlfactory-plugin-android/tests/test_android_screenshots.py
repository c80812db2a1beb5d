"""``env_options.screenshot``: the screen as an image part of the messages, for
vision-language models. The env's messages on the simulated phone; ``rlf train`` (vllm
backend) and ``rlf eval`` (hf backend) on a tiny random LLaVA built from a config (the
embedded model's tokenizer); the config error for a text-only model."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rlfactory_core import ConfigError, ParsedTurn, ToolCall
from rlfactory_core.testing import ConcurrentToolManager
from rlfactory_android import AndroidEnv
from rlfactory_android.device import DeviceError

PNG = b"\x89PNG\r\n\x1a\n"
TASK = {"id": "t", "goal": "Turn off Wi-Fi.", "start": {"settings": {"global/wifi_on": "1"}},
        "check": {"kind": "setting", "name": "global/wifi_on", "value": "0"}}


async def test_the_task_and_every_turn_with_actions_come_with_a_screenshot():
    env = AndroidEnv(few_shot=False, screenshot=True)
    assert env.shows_images and not AndroidEnv(few_shot=False).shows_images
    reset = await env.reset(TASK)
    opening = reset.messages[-1]
    assert opening.content.startswith("Task: Turn off Wi-Fi.") and len(opening.images) == 1
    assert opening.images[0].startswith(PNG)
    manager = ConcurrentToolManager(tools=reset.tools)
    call = ToolCall(name="open_app", arguments={"app": "Settings"})
    results = await manager.call([call], {"state": reset.state, "tool_names": {t.name for t in reset.tools}})
    step = await env.step(reset.state, ParsedTurn(text="", tool_calls=[call]), results)
    assert not step.done and len(step.observation) == 1
    shown = step.observation[0]
    assert shown.images[0].startswith(PNG) and shown.images[0] != opening.images[0]  # Settings is open now
    # a turn without actions ends the episode with no picture
    assert (await env.step(reset.state, ParsedTurn(text="Done.", content="Done."), [])).done

    def broken():
        raise DeviceError("screencap failed")
    reset.state["device"].screenshot = broken
    step = await env.step(reset.state, ParsedTurn(text="", tool_calls=[call]), results)
    assert step.observation[0].content == "Screenshot:\n(No screenshot: screencap failed)"
    assert not step.observation[0].images
    await env.close(reset.state)
    await manager.close()


async def test_screenshots_are_squares_and_a_failed_first_one_is_said_in_words(monkeypatch):
    """LLaVA's processor crops the middle square: the portrait screen is padded to a square
    so that none of it is cut off. A failing screenshot at the start does not end the episode."""
    import io

    from PIL import Image

    from rlfactory_android.simulated import SimulatedPhone

    env = AndroidEnv(few_shot=False, screenshot=True)
    reset = await env.reset(TASK)
    with Image.open(io.BytesIO(reset.messages[-1].images[0])) as picture:
        width, height = picture.size
        assert width == height
        phone_width, phone_height = SimulatedPhone(serial="x").screen_size
        assert height == max(phone_width, phone_height) // 3  # the whole screen, drawn at 1/3
        assert picture.getpixel((0, 0)) == (0, 0, 0) and picture.getpixel((width // 2, 5)) != (0, 0, 0)
    await env.close(reset.state)

    def broken(self):
        raise DeviceError("screencap failed")
    monkeypatch.setattr(SimulatedPhone, "screenshot", broken)
    reset = await env.reset(TASK)
    opening = reset.messages[-1]
    assert opening.content.startswith("Task: Turn off Wi-Fi.") and opening.content.endswith(
        "(No screenshot: screencap failed)") and not opening.images
    await env.close(reset.state)


def test_screenshot_must_be_a_boolean():
    with pytest.raises(ConfigError, match="env_options.screenshot: must be true or false, got 'yes'"):
        AndroidEnv(screenshot="yes")


def test_a_text_only_model_is_refused_before_the_run(tmp_path):
    from rlfactory_core.testing import load_config, train

    config = load_config([], ["env=android", "env_options={screenshot: true, few_shot: false}", "backend=hf",
                              f"run_dir={tmp_path / 'run'}", "logging.live=off"])
    with pytest.raises(ConfigError, match="text-only model"):
        train(config)
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.slow
def test_rlf_train_and_eval_android_with_screenshots_on_a_vision_language_model(tmp_path, tiny_vlm_dir):
    run_dir = tmp_path / "run"
    common = [f"model.name={tiny_vlm_dir}", "data.eval_size=2", "logging.live=off",
              "rollout.max_turns=2", "rollout.max_tokens_per_turn=16", "env_options={few_shot: false, screenshot: true}"]
    log = tmp_path / "train.log"
    with open(log, "w") as out:
        code = subprocess.call([sys.executable, "-m", "rlfactory_cli", "train", "--env", "android",
                                "--run-dir", str(run_dir), *common, "backend=vllm", "train.steps=2", "grpo.prompts_per_step=2",
                                "grpo.group_size=2", "eval.every=2", "eval.save_samples=2",
                                "cold_start.source=off"],  # the default warm-up: tested without screenshots
                               stdout=out, stderr=subprocess.STDOUT, timeout=600, env=dict(os.environ))
    assert code == 0, log.read_text()[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    assert all(r.get("rollout/stop/env_error", 0.0) == 0.0 for r in records[1:])  # every prompt rendered
    samples = [json.loads(line) for line in (run_dir / "samples" / "step-000002.jsonl").read_text().splitlines()]
    assert samples and all(s["text"].count("<image>") >= 4 for s in samples)  # each screenshot's 4 image tokens
    model_dir = run_dir / "checkpoints" / "latest"
    assert model_dir.exists()

    from rlfactory_core import load_processor
    from rlfactory_core.testing import latest_checkpoint

    assert load_processor(latest_checkpoint(run_dir) / "model") is not None  # saved with its image processor
    report_dir = tmp_path / "report"
    eval_log = tmp_path / "eval.log"
    with open(eval_log, "w") as out:
        code = subprocess.call([sys.executable, "-m", "rlfactory_cli", "eval", "--env", "android", "--model",
                                str(run_dir), "--size", "2", "--report", str(report_dir), *common, "backend=hf"],
                               stdout=out, stderr=subprocess.STDOUT, timeout=600, env=dict(os.environ))
    assert code == 0, eval_log.read_text()[-3000:]
    report = json.loads((report_dir / "report.json").read_text())
    assert report["samples"] == 2 and "eval/reward/android_task/success" in report["metrics"]
    assert report["metrics"].get("eval/rollout/stop/env_error", 0.0) == 0.0
