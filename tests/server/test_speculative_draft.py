"""Speculative decoding with a draft model on the real server: the real
SmolLM2 drafting for itself gives the same greedy answers as speculation off,
token for token, alone and several at once; every draft token is accepted
(the machinery's own check); a bad draft is refused at start with the reason."""

import json

import pytest

from conftest import ROOT, Server, model_path
from test_speculative import CHAT, COPY, FLAGS, answer, answers_together, metric

SELF_DRAFT = json.dumps({"model": model_path(), "num_speculative_tokens": 4})
MESSAGES = [COPY[0], CHAT[0], COPY[1], CHAT[1], CHAT[2], CHAT[3]]


@pytest.fixture(scope="module")
def servers():
    off = Server(*FLAGS)
    on = Server(*FLAGS, "--speculative-config", SELF_DRAFT)
    yield off, on
    off.close()
    on.close()


def test_a_draft_identical_to_the_target_is_exact_and_has_every_draft_accepted(servers):
    off, on = servers
    want = [answer(off, m) for m in MESSAGES]
    for m, w in zip(MESSAGES[:3], want[:3]):
        assert answer(on, m) == w, m[:60]
    assert answers_together(on, MESSAGES) == want
    drafted = metric(on, "vllm:spec_decode_num_draft_tokens_total")
    accepted = metric(on, "vllm:spec_decode_num_accepted_tokens_total")
    # A draft model proposes for chat with nothing to copy too, and the
    # target agrees with every token its own copy proposes.
    assert drafted > 0 and accepted == drafted, (accepted, drafted)
    assert on.metric("ferrox_kv_blocks_used") == 0
    assert "draft model loaded" in on.log_text()


@pytest.mark.parametrize("config,why", [
    ('{"model": "/nonexistent/draft.gguf", "num_speculative_tokens": 4}', "/nonexistent/draft.gguf"),
    ('{"model": "d.gguf", "num_speculative_tokens": 0}', "num_speculative_tokens must be 1 to 16, not 0"),
    ('{"model": "d.gguf", "num_speculative_tokens": 17}', "num_speculative_tokens must be 1 to 16, not 17"),
])
def test_a_bad_draft_is_refused_at_start_with_the_reason(config, why):
    with pytest.raises(RuntimeError) as e:
        Server("--speculative-config", config).close()
    assert why in str(e.value), str(e.value)


def test_a_draft_with_another_tokenizer_is_refused_at_start():
    glm = ROOT / "server" / "models" / "testdata" / "families" / "glm4moe"
    config = json.dumps({"model": str(glm), "num_speculative_tokens": 4})
    with pytest.raises(RuntimeError) as e:
        Server("--speculative-config", config).close()
    assert "does not share the target's tokenizer" in str(e.value), str(e.value)
