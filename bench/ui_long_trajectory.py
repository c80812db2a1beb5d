"""`rlf ui` on one very long trajectory (issue 41): a recorded trajectory of ``--tokens``
(1,000,000) tokens opened in a real browser (Debian's headless Chromium, as the browser tests
drive it), through the real app served by uvicorn.

The run it writes holds one eval record made of real text: deepsearch-shaped passages and
answers tokenized by the embedded model's tokenizer (its real pieces), a prompt of 2,000 tokens
and model turns after it, with every per-token column (sampler and trainer logprobs, advantage,
policy version, loss mask, segment, turn), written by the real ``write_records``.

Timed, ``--repeats`` times each (median and min-max):

- ``open``: from the click on the trajectory's row in the list to its first model token on
  screen (the API's response, its JSON parse and the drawing included);
- ``recolour``: from choosing another colour (``advantage``) to the drawn tokens repainted
  (the next animation frame after the change);
- ``to the end``: scrolling the token view to its bottom until the last token is drawn.

    .venv/bin/python bench/ui_long_trajectory.py                  # ~2 min
    .venv/bin/python bench/ui_long_trajectory.py --tokens 128000 --repeats 3
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # tests/browser.py: the Chromium the browser tests use

TOKEN = "bench-token-0123456789abcdef"
TEXT = ("Doc 1 (Title: \"Nairobi\") Nairobi is the capital and largest city of Kenya. The city lies on the "
        "Nairobi River in the south of the country.\n<think>The passage says Nairobi is the capital of "
        "Kenya.</think>\n<search>Kenya official language</search>\n")


def write_run(runs: Path, tokens: int) -> None:
    from rlfactory_core.models import load_tokenizer
    from rlfactory_core.records import write_records

    tokenizer = load_tokenizer("smollm2-135m-instruct")
    ids = tokenizer(TEXT * (tokens // 40 + 1), add_special_tokens=False)["input_ids"][:tokens]
    pieces = [tokenizer.decode([i]) for i in ids[:4096]]  # the text repeats: its pieces too
    pieces = [pieces[i % len(pieces)] for i in range(len(ids))]
    prompt = 2000
    model = [i >= prompt and (i // 300) % 2 == 0 for i in range(len(ids))]
    sequence = {"token_ids": ids, "pieces": pieces, "segment": [1 if m else (0 if i < prompt else 2)
                                                                for i, m in enumerate(model)],
                "turn": [-1 if i < prompt else (i - prompt) // 600 for i in range(len(ids))],
                "loss_mask": [int(m) for m in model],
                "sampler_logprob": [-0.4 - (i % 13) / 20 if m else None for i, m in enumerate(model)],
                "trainer_logprob": [-0.4 - (i % 13) / 20 + (i % 7) * 1e-4 if m else None for i, m in enumerate(model)],
                "advantage": [((i % 5) - 2) / 2 if m else None for i, m in enumerate(model)],
                "policy_version": [3 if m else -1 for m in model]}
    record = {"step": 1, "kind": "eval", "index": 0, "sample_id": "long-0", "group": -1, "reward": 1.0,
              "final_answer": "Swahili", "stop_reason": "no_tool_call",
              "messages": [{"role": "user", "content": "a long agent episode"}], "sequences": [sequence]}
    write_records(runs / "long", "eval", 1, [record])
    (runs / "long" / "config.yaml").write_text("env: deepsearch\n")


def serve(runs: Path):
    import uvicorn

    from rlfactory_cli.ui.app import create_app

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(runs, token=TOKEN, port=sock.getsockname()[1]),
                                           log_level="warning"))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return server, f"http://127.0.0.1:{sock.getsockname()[1]}"


def measure(driver, base: str, tokens: int) -> dict[str, float]:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(f"{base}/#/run/long")
    WebDriverWait(driver, 120, 0.05).until(lambda d: d.find_elements(By.CSS_SELECTOR, "tr.trajectory-row"))
    opened = driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        const t0 = performance.now();
        document.querySelector("tr.trajectory-row").click();
        (function poll() {
          const tok = document.querySelector("#tokens .tok.seg-1");
          if (tok && tok.getBoundingClientRect().height > 0) { requestAnimationFrame(() => done(performance.now() - t0)); }
          else setTimeout(poll, 5);
        })();""")
    recolour = driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        const select = document.getElementById("colour-mode");
        const t0 = performance.now();
        select.value = "advantage"; select.dispatchEvent(new Event("change"));
        requestAnimationFrame(() => requestAnimationFrame(() => done(performance.now() - t0)));""")
    started = time.perf_counter()
    while True:
        found = driver.execute_script(
            "const b = document.getElementById('tokens'); b.scrollTop = b.scrollHeight;"
            "return !!document.querySelector(`#tokens .tok[data-i='${arguments[0]}']`)", tokens - 1)
        if found:
            break
        if time.perf_counter() - started > 300:
            raise RuntimeError("the last token was not drawn within 300 s of scrolling")
        time.sleep(0.02)
    return {"open": opened / 1000, "recolour": recolour / 1000, "to the end": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from browser import chromium

    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp) / "runs"
        started = time.perf_counter()
        write_run(runs, args.tokens)
        print(f"wrote a {args.tokens:,}-token trajectory in {time.perf_counter() - started:.0f} s", flush=True)
        server, base = serve(runs)
        times: dict[str, list[float]] = {}
        with chromium(Path(tmp) / "profile") as driver:
            driver.set_script_timeout(300)
            driver.get(f"{base}/?token={TOKEN}")
            for _ in range(args.repeats):
                for key, value in measure(driver, base, args.tokens).items():
                    times.setdefault(key, []).append(value)
        server.should_exit = True
    print(f"\n{args.tokens:,} tokens, {args.repeats} repeats: median (min-max), seconds\n")
    print("| operation | time |\n|---|---|")
    for key, values in times.items():
        print(f"| {key} | {statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f}) |")


if __name__ == "__main__":
    main()
