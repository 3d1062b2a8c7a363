"""A SmolLM3 model served: its template from the GGUF (helpers/smollm3_template.py), thinking on by
default (the reply writes its own <think>, returned apart as reasoning_content) and off through
OpenAI's chat_template_kwargs (an empty thought closed in the prompt). A tiny random smollm3 (every
4th layer without RoPE), so grammars force what it writes."""
from __future__ import annotations

import openai
import pytest

from helpers.smollm3_template import FIXTURE


@pytest.fixture(scope="module")
def server_model(tmp_path_factory):
    from helpers.tiny_models import write_tiny_model

    d = tmp_path_factory.mktemp("tiny-smollm3")
    return write_tiny_model(d / "tiny-smollm3.gguf", "smollm3", seed=7, chat_template=FIXTURE, n_ctx=1024)


@pytest.fixture(scope="module")
def server_args():
    return ("--ctx", "1024", "--threads", "2", "--parallel", "2")


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="x", max_retries=0, timeout=300)


def test_thinking_on_and_off(client):
    model = client.models.list().data[0].id
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    on = client.chat.completions.create(model=model, messages=msgs, max_tokens=60, seed=4, extra_body={
        "grammar": 'root ::= "<think>" [a-z ]{3,12} "</think>" "\\n" "yes"'})
    assert on.choices[0].message.content == "yes"
    thought = on.choices[0].message.model_extra["reasoning_content"]
    assert 3 <= len(thought) <= 12 and "<" not in thought
    off = client.chat.completions.create(model=model, messages=msgs, max_tokens=40, seed=4, extra_body={
        "grammar": 'root ::= "yes"', "chat_template_kwargs": {"enable_thinking": False}})
    assert off.choices[0].message.content == "yes" and not off.choices[0].message.model_extra.get("reasoning_content")
    # the same instructions, "/no_think" for "/think" and the closed, empty thought
    assert off.usage.prompt_tokens > on.usage.prompt_tokens
