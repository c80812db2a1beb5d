"""Chat-template deltas and the re-tokenization checker, with the default model's real tokenizer."""

from __future__ import annotations

import copy

import pytest

from rlfactory_core.errors import ModelError
from rlfactory_core.models import load_tokenizer
from rlfactory_core.rollout import ChatTemplate, check_retokenization
from rlfactory_core.types import Message, Segment, Trajectory


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    return load_tokenizer(default_model_dir)


@pytest.fixture(scope="module")
def chat(tokenizer):
    return ChatTemplate(tokenizer)


OPENING = [Message(role="system", content="Be brief."), Message(role="user", content="What is 12*7?")]
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*7"}}\n</tool_call>'
RESULT = [Message(role="user", content="<tool_response>\n84\n</tool_response>")]


def model_turn(chat: ChatTemplate, text: str, end: bool = True) -> list[int]:
    """Ids as a backend would return them: the text's tokens, then the end-of-turn token."""
    return chat.encode(text) + ([chat.tokenizer.eos_token_id] if end else [])


def test_chatml_turn_suffix(chat):
    assert chat.turn_suffix == "<|im_end|>\n"


def test_prompt_ids_end_with_the_generation_prompt(chat):
    ids = chat.prompt_ids(OPENING)
    text = chat.decode(ids, skip_special_tokens=False)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 12*7?<|im_end|>\n"
                    "<|im_start|>assistant\n")


def test_observation_after_an_end_of_turn_token_adds_only_the_rest(chat):
    turn = model_turn(chat, CALL)
    ids = chat.observation_ids(turn, RESULT)
    assert chat.decode(ids, skip_special_tokens=False) == (
        "\n<|im_start|>user\n<tool_response>\n84\n</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_observation_after_a_cut_off_turn_closes_it(chat):
    turn = model_turn(chat, CALL[:20], end=False)
    text = chat.decode(chat.observation_ids(turn, RESULT), skip_special_tokens=False)
    assert text.startswith("<|im_end|>\n<|im_start|>user\n")


def test_appended_ids_equal_the_rendered_conversation(chat):
    """Prompt + model turn + observation decode to exactly what the template renders."""
    turn = model_turn(chat, CALL)
    ids = chat.prompt_ids(OPENING) + turn + chat.observation_ids(turn, RESULT)
    conversation = [*OPENING, Message(role="assistant", content=CALL), *RESULT]
    assert chat.decode(ids, skip_special_tokens=False) == chat.render(conversation, add_generation_prompt=True)
    assert ids == chat.encode(chat.render(conversation, add_generation_prompt=True))


def test_several_observation_messages_render_in_order(chat):
    observation = [*RESULT, Message(role="user", content="Now what is 3+5?")]
    text = chat.decode(chat.observation_ids(model_turn(chat, CALL), observation), skip_special_tokens=False)
    assert text.index("84") < text.index("3+5")
    assert text.endswith("<|im_start|>assistant\n")


def _with_template(tokenizer, template: str):
    changed = copy.deepcopy(tokenizer)
    changed.chat_template = template
    return changed


def test_template_without_chat_template_is_refused(tokenizer):
    with pytest.raises(ModelError, match="no chat template"):
        ChatTemplate(_with_template(tokenizer, ""))


def test_template_that_rewrites_assistant_content_is_refused(tokenizer):
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content | upper }}</s>{% endfor %}"
    with pytest.raises(ModelError, match="verbatim"):
        ChatTemplate(_with_template(tokenizer, template))


def test_template_that_is_not_append_only_is_refused(tokenizer):
    # Renders the message count first: every added message changes the beginning.
    template = ("{{ messages | length }}{% for m in messages %}<{{ m.role }}>{{ m.content }}</s>{% endfor %}"
                "{% if add_generation_prompt %}<assistant>{% endif %}")
    chat = ChatTemplate(_with_template(tokenizer, template))
    with pytest.raises(ModelError, match="rewrites earlier turns"):
        chat.observation_ids([1, 2], RESULT)


def _trajectory(chat, model_ids: list[int]) -> Trajectory:
    observation = chat.observation_ids(model_ids, RESULT)
    answer = model_turn(chat, "The answer is 84.")
    return Trajectory(
        sample_id="t", prompt_ids=chat.prompt_ids(OPENING),
        messages=[*OPENING, Message(role="assistant", content=chat.decode(model_ids)), *RESULT,
                  Message(role="assistant", content="The answer is 84.")],
        segments=[Segment("model", model_ids, [0.0] * len(model_ids)),
                  Segment("observation", observation, num_messages=1),
                  Segment("model", answer, [0.0] * len(answer))],
    )


def test_checker_accepts_canonical_ids(chat):
    report = check_retokenization(_trajectory(chat, model_turn(chat, CALL)), chat)
    assert report.ok, report.describe()
    assert "token-exact" in report.describe()


def test_checker_reports_a_non_canonical_tokenization(chat):
    """The model may sample "calc" + "ulator" where the tokenizer writes "calculator": same
    text, other ids. The checker points at the first such token."""
    canonical = model_turn(chat, CALL)
    word = chat.encode("calculator")
    split = [i for piece in ("calc", "ulator") for i in chat.encode(piece)]
    assert split != word
    start = next(i for i in range(len(canonical)) if canonical[i:i + len(word)] == word)
    sampled = canonical[:start] + split + canonical[start + len(word):]
    assert chat.decode(sampled) == chat.decode(canonical)
    trajectory = _trajectory(chat, sampled)
    report = check_retokenization(trajectory, chat)
    assert not report.ok
    assert report.first_difference == len(trajectory.prompt_ids) + start
    assert "calc" in report.kept and "differs at token" in report.describe()


def test_self_check_of_the_default_template(chat):
    from rlfactory_core.rollout.render import self_check

    assert chat.turn_end_id == chat.tokenizer.convert_tokens_to_ids("<|im_end|>")
    report = self_check(chat)
    assert report.ok, report.describe()
