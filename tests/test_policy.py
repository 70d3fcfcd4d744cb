"""Tests of the torch policy: tokenizer, built-in GPT, sampling, KV cache, scoring."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from agentrl.policy import (  # noqa: E402
    CharTokenizer,
    GPTConfig,
    Policy,
    SamplingParams,
    TinyGPT,
)
from agentrl.policy.sampling import StopMatcher, sample_next, top_p_mask  # noqa: E402

torch.set_num_threads(2)

SMALL = GPTConfig(n_layer=2, n_head=2, d_model=32, max_seq_len=96)
PROMPTS = ["def f(x):", "a", "The quick brown fox jumps", "éè ünïcödé →"]


@pytest.fixture(scope="module")
def policy() -> Policy:
    return Policy.builtin(SMALL, device="cpu", seed=1)


def greedy(n: int = 24, **kw: object) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=0.0, **kw)  # type: ignore[arg-type]


# ---------------------------------------------------------------- tokenizer


def test_char_tokenizer_round_trip_and_specials() -> None:
    tok = CharTokenizer()
    text = "héllo\n\tworld ✓ 🙂"
    ids = tok.encode(text, bos=True, eos=True)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert all(0 <= i < 256 for i in ids[1:-1])
    assert tok.decode(ids) == text
    assert tok.decode([*ids[1:3], tok.pad_id, *ids[3:-1]]) == text
    assert tok.encode_prompt("x") == [tok.bos_id, ord("x")]
    assert tok.decode([0xC3]) == "\ufffd"  # a cut UTF-8 sequence decodes, replaced
    with pytest.raises(ValueError, match="outside"):
        tok.decode([tok.vocab_size])
    with pytest.raises(TypeError):
        tok.encode(b"bytes")  # type: ignore[arg-type]


# ---------------------------------------------------------------- model


def test_gpt_config_validation() -> None:
    with pytest.raises(ValueError, match="n_head"):
        GPTConfig(n_head=3, d_model=128)
    with pytest.raises(ValueError, match="n_layer"):
        GPTConfig(n_layer=0)
    with pytest.raises(ValueError, match="unknown"):
        GPTConfig.from_dict({"n_layer": 2, "bogus": 1})
    assert GPTConfig.from_dict(SMALL.to_dict()) == SMALL


def test_tinygpt_weight_tying_and_cache_equivalence() -> None:
    torch.manual_seed(0)
    model = TinyGPT(SMALL).eval()
    assert model.head.weight is model.tok.weight
    ids = torch.randint(0, 256, (3, 17))
    full = model(ids)
    cache = model.new_cache(3, 17)
    pieces = [model(ids[:, :5], cache=cache)]
    pieces += [model(ids[:, t : t + 1], cache=cache) for t in range(5, 17)]
    torch.testing.assert_close(torch.cat(pieces, 1), full, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="max_seq_len"):
        model(torch.zeros((1, SMALL.max_seq_len + 1), dtype=torch.long))


def test_tinygpt_padding_is_invisible() -> None:
    torch.manual_seed(0)
    model = TinyGPT(SMALL).eval()
    ids = torch.randint(0, 256, (1, 9))
    padded = torch.cat([torch.full((1, 4), 256), ids], 1)
    mask = torch.cat([torch.zeros(1, 4), torch.ones(1, 9)], 1).long()
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    out = model(padded, attention_mask=mask, position_ids=pos)
    torch.testing.assert_close(out[:, 4:], model(ids), atol=1e-5, rtol=1e-5)
    assert torch.isfinite(out).all()  # padding queries do not produce NaN


# ---------------------------------------------------------------- generation


def test_cached_generation_equals_recomputation(policy: Policy) -> None:
    cached = policy.generate(PROMPTS, greedy())
    plain = policy.generate(PROMPTS, greedy(), use_cache=False)
    for a, b in zip(cached, plain, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        assert len(a.token_ids) == len(a.logprobs) > 0
    scored = policy.token_logprobs([g.prompt_ids for g in cached], [g.token_ids for g in cached])
    for g, lp in zip(cached, scored, strict=True):
        assert lp.dtype == torch.float32 and lp.shape == (len(g.token_ids),)
        assert lp.tolist() == pytest.approx(g.logprobs, abs=1e-4)


def test_sampled_logprobs_match_token_logprobs_at_temperature(policy: Policy) -> None:
    params = SamplingParams(max_new_tokens=16, temperature=0.7, top_p=0.9, seed=3)
    gens = policy.generate(PROMPTS, params)
    scored = policy.token_logprobs(
        [g.prompt_ids for g in gens], [g.token_ids for g in gens], temperature=0.7
    )
    for g, lp in zip(gens, scored, strict=True):
        assert lp.tolist() == pytest.approx(g.logprobs, abs=1e-4)
    at_one = policy.token_logprobs([gens[0].prompt_ids], [gens[0].token_ids])[0]
    assert not torch.allclose(at_one, scored[0])


def test_left_padding_matches_one_at_a_time(policy: Policy) -> None:
    batched = policy.generate(PROMPTS, greedy(20))
    for prompt, b in zip(PROMPTS, batched, strict=True):
        (alone,) = policy.generate([prompt], greedy(20))
        assert alone.token_ids == b.token_ids
        assert alone.text == b.text
        assert alone.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_seed_reproducibility(policy: Policy) -> None:
    params = SamplingParams(max_new_tokens=24, temperature=1.0, seed=1234)
    a = policy.generate(PROMPTS, params)
    b = policy.generate(PROMPTS, params)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    c = policy.generate(PROMPTS, SamplingParams(max_new_tokens=24, temperature=1.0, seed=99))
    assert [g.token_ids for g in a] != [g.token_ids for g in c]


def test_token_logprobs_is_differentiable(policy: Policy) -> None:
    gens = policy.generate(PROMPTS[:2], greedy(8))
    lps = policy.token_logprobs([g.prompt_ids for g in gens], [g.token_ids for g in gens])
    loss = -torch.cat(lps).sum()
    policy.model.zero_grad()
    loss.backward()
    grads = [p.grad for p in policy.model.parameters() if p.grad is not None]
    assert grads and any(bool(g.abs().sum() > 0) for g in grads)
    policy.model.zero_grad()
    with torch.no_grad():
        assert not policy.token_logprobs([[1, 2]], [[3]])[0].requires_grad
    assert policy.token_logprobs([], []) == []
    with pytest.raises(ValueError, match="empty"):
        policy.token_logprobs([[]], [[1]])
    with pytest.raises(ValueError, match="2 prompts but 1"):
        policy.token_logprobs([[1], [2]], [[3]])


def test_sampling_params_validation() -> None:
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=1.5)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingParams(max_new_tokens=0)
    with pytest.raises(ValueError, match="stop"):
        SamplingParams(stop=("",))
    assert SamplingParams(stop="\n").stop == ("\n",)  # type: ignore[arg-type]
    assert SamplingParams(stop=["a", "b"]).stop == ("a", "b")  # type: ignore[arg-type]


# ---------------------------------------------------------------- stop strings, top-p


def test_stop_strings_cut_text_and_tokens_consistently(policy: Policy) -> None:
    (free,) = policy.generate([PROMPTS[0]], greedy(40))
    text = free.text
    assert len(text) >= 6, text
    stop = text[3:5]  # a string the greedy completion is known to contain
    first = text.index(stop)
    (cut,) = policy.generate([PROMPTS[0]], greedy(40, stop=("\x00never", stop)))
    assert cut.finish_reason == "stop" and cut.stop == stop
    assert cut.text == text[:first]
    # the tokens end with the one that completed the stop string, and are a prefix of the
    # free run's tokens with the same log-probs
    n = len(cut.token_ids)
    assert cut.token_ids == free.token_ids[:n]
    assert cut.logprobs == pytest.approx(free.logprobs[:n], abs=1e-5)
    assert stop in policy.tokenizer.decode(cut.token_ids)
    assert stop not in policy.tokenizer.decode(cut.token_ids[:-1])


def test_finish_reason_length_and_context_limit() -> None:
    # the length limit: exactly max_new_tokens tokens
    plain = Policy.builtin(SMALL, device="cpu", seed=1)
    (g,) = plain.generate(["hi"], greedy(7))
    assert g.finish_reason == "length" and len(g.token_ids) == 7
    # the context limit: a long prompt leaves little room
    prompt = "x" * (SMALL.max_seq_len - 4)  # + BOS: 3 positions left
    (g,) = plain.generate([prompt], greedy(50))
    assert g.finish_reason == "length" and len(g.token_ids) == 3
    with pytest.raises(ValueError, match="no room"):
        plain.generate(["x" * SMALL.max_seq_len], greedy(5))


def test_eos_finishes_a_row_and_is_kept() -> None:
    pol = Policy.builtin(SMALL, device="cpu", seed=1)
    (free,) = pol.generate(["hello"], greedy(12))
    pol.eos_ids = frozenset({free.token_ids[3]})  # pretend the 4th token is EOS
    (g,) = pol.generate(["hello"], greedy(12))
    k = free.token_ids.index(free.token_ids[3])
    assert g.finish_reason == "eos"
    assert g.token_ids == free.token_ids[: k + 1]
    assert len(g.logprobs) == k + 1


def test_top_p_mask_edge_cases() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.25, 0.25, 0.25, 0.25], [0.1, 0.6, 0.3, 0.0]])
    # p = 1 keeps every token with mass before it below 1 (zero-probability tails included)
    assert top_p_mask(probs, torch.tensor([1.0, 1.0, 1.0]))[:, :3].all()
    # a tiny p keeps only the most likely token
    tiny = top_p_mask(probs, torch.tensor([1e-6, 1e-6, 1e-6]))
    assert tiny.sum(1).tolist() == [1, 1, 1]
    assert tiny[0, 0] and tiny[2, 1]
    # exactly reaching p: 0.5 + 0.3 = 0.8 covers p = 0.8, so two tokens
    m = top_p_mask(probs, torch.tensor([0.8, 0.5, 0.65]))
    assert m[0].tolist() == [True, True, False, False]
    assert int(m[1].sum()) == 2  # ties: the mass reaches 0.5 after two of the four
    assert m[2].tolist() == [False, True, True, False]


def test_sample_next_respects_top_p_and_greedy_rows() -> None:
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.1], [0.6, 0.3, 0.1]]))
    gen = torch.Generator().manual_seed(0)
    seen: set[int] = set()
    for _ in range(300):
        tokens, lps = sample_next(logits, torch.tensor([1.0, 0.0]), torch.tensor([0.7, 1.0]), gen)
        seen.add(int(tokens[0]))
        assert int(tokens[1]) == 0  # greedy row
        # reported log-prob: of the untruncated temperature-scaled distribution
        assert float(lps[0]) == pytest.approx(math.log([0.6, 0.3, 0.1][int(tokens[0])]), abs=1e-5)
    assert seen == {0, 1}  # 0.1 lies outside the 0.7 nucleus, both others are drawn
    # temperature scales the reported log-probs
    tokens, lps = sample_next(logits, torch.tensor([0.5, 2.0]), torch.tensor([1.0, 1.0]), gen)
    for row, t in enumerate((0.5, 2.0)):
        expect = torch.log_softmax(logits[row] / t, -1)[tokens[row]]
        assert float(lps[row]) == pytest.approx(float(expect), abs=1e-5)


def test_stop_matcher_finds_earliest_new_match() -> None:
    m = StopMatcher(["\n\n", "END"])
    assert m.find("abc", 0) is None
    assert m.find("ab\n\nEND", 0) == (2, "\n\n")
    assert m.find("xxEN", 0) is None
    assert m.find("xxEND", 4) == (2, "END")  # a match straddling the checked boundary
    assert StopMatcher([]).find("anything", 0) is None


# ---------------------------------------------------------------- weights, save, load


def test_builtin_save_load_round_trip(tmp_path, policy: Policy) -> None:
    pol = policy.copy()
    pol.version = 7
    pol.save(tmp_path / "ckpt")
    loaded = Policy.load(tmp_path / "ckpt", device="cpu")
    assert loaded.version == 7 and isinstance(loaded.model, TinyGPT)
    assert loaded.model.config == SMALL
    a = pol.generate(PROMPTS, greedy(12))
    b = loaded.generate(PROMPTS, greedy(12))
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert all(g.version == 7 for g in b)
    with pytest.raises(ValueError, match="not a directory"):
        Policy.load(tmp_path / "missing")


def test_set_weights_changes_outputs_and_version(policy: Policy) -> None:
    other = Policy.builtin(SMALL, device="cpu", seed=5)
    target = policy.copy()
    before = target.generate(PROMPTS, greedy(12))
    target.set_weights(other.state_dict(), version=3)
    after = target.generate(PROMPTS, greedy(12))
    expect = other.generate(PROMPTS, greedy(12))
    assert [g.token_ids for g in after] == [g.token_ids for g in expect]
    assert [g.token_ids for g in after] != [g.token_ids for g in before]
    assert {g.version for g in after} == {3} and {g.version for g in before} == {0}
    with pytest.raises(TypeError, match="version"):
        target.set_weights(other.state_dict(), version="4")  # type: ignore[arg-type]


def test_generate_input_validation(policy: Policy) -> None:
    with pytest.raises(TypeError, match="one str"):
        policy.generate("abc", greedy())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="str"):
        policy.generate([b"abc"], greedy())  # type: ignore[list-item]
    with pytest.raises(ValueError, match="2 prompts but 1"):
        policy.generate(["a", "b"], [greedy()])
    assert policy.generate([], greedy()) == []


def test_per_row_params_and_compaction_match_single_runs(policy: Policy) -> None:
    # rows of different lengths finish at different steps: the running batch is compacted
    prompts = [f"{i}: " + PROMPTS[i % 4] for i in range(12)]
    rows = [greedy(2 + 3 * i) for i in range(12)]
    batched = policy.generate(prompts, rows)
    assert [len(g.token_ids) for g in batched] == [2 + 3 * i for i in range(12)]
    for p, r, b in zip(prompts, rows, batched, strict=True):
        (alone,) = policy.generate([p], r)
        assert alone.token_ids == b.token_ids
        assert alone.logprobs == pytest.approx(b.logprobs, abs=1e-4)


# ---------------------------------------------------------------- Hugging Face models


def _char_tokenizer_fast():  # type: ignore[no-untyped-def]
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    for c in range(32, 127):
        vocab[chr(c)] = len(vocab)
    tk = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = tokenizers.pre_tokenizers.Split("", behavior="isolated")
    tk.decoder = tokenizers.decoders.Fuse()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tk, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def hf_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A tiny randomly initialised Hugging Face model with its tokenizer, saved to disk."""
    transformers = pytest.importorskip("transformers")
    tok = _char_tokenizer_fast()
    common = {"vocab_size": len(tok), "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
    torch.manual_seed(0)
    if request.param == "gpt2":
        cfg = transformers.GPT2Config(n_positions=128, n_embd=32, n_layer=2, n_head=2, **common)
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.LlamaConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            **common,
        )
        model = transformers.LlamaForCausalLM(cfg)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_hf_generation_cache_padding_and_scoring(hf_dir) -> None:  # type: ignore[no-untyped-def]
    pol = Policy.from_pretrained(hf_dir, device="cpu")
    assert pol.dtype == torch.float32 and pol.eos_ids == frozenset({2})
    prompts = ["def f(x):", "a", "The quick brown fox"]
    cached = pol.generate(prompts, greedy(16))
    plain = pol.generate(prompts, greedy(16), use_cache=False)
    scored = pol.token_logprobs([g.prompt_ids for g in cached], [g.token_ids for g in cached])
    for p, a, b, lp in zip(prompts, cached, plain, scored, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        assert lp.tolist() == pytest.approx(a.logprobs, abs=1e-4)
        assert a.prompt_ids == pol.tokenizer.encode(p)
        assert a.text == pol.tokenizer.decode(a.token_ids)
        (alone,) = pol.generate([p], greedy(16))
        assert alone.token_ids == a.token_ids
    rows = [greedy(2 + i) for i in range(9)]  # compaction of a Hugging Face cache
    batched = pol.generate(prompts * 3, rows)
    for p, r, b in zip(prompts * 3, rows, batched, strict=True):
        assert pol.generate([p], r)[0].token_ids == b.token_ids


def test_hf_save_load_and_sampling(hf_dir, tmp_path) -> None:  # type: ignore[no-untyped-def]
    pol = Policy.from_pretrained(hf_dir, device="cpu")
    params = SamplingParams(max_new_tokens=12, temperature=0.8, top_p=0.9, seed=4)
    a = pol.generate(["hello", "x"], params)
    pol.version = 2
    pol.save(tmp_path / "saved")
    back = Policy.load(tmp_path / "saved", device="cpu")
    assert back.version == 2 and type(back.model) is type(pol.model)
    b = back.generate(["hello", "x"], params)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    scored = back.token_logprobs(
        [g.prompt_ids for g in b], [g.token_ids for g in b], temperature=0.8
    )
    for g, lp in zip(b, scored, strict=True):
        assert lp.tolist() == pytest.approx(g.logprobs, abs=1e-4)
    with pytest.raises(ValueError, match="no config"):
        Policy.from_pretrained(tmp_path)


# ---------------------------------------------------------------- GPU (skipped without CUDA)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
def test_gpu_bf16_generation() -> None:
    pol = Policy.builtin(GPTConfig(max_seq_len=128), seed=0)  # defaults: CUDA, bfloat16
    assert pol.device.type == "cuda" and pol.dtype == torch.bfloat16
    assert next(pol.model.parameters()).dtype == torch.bfloat16
    prompts = PROMPTS * 8
    gens = pol.generate(prompts, SamplingParams(max_new_tokens=48, temperature=0.8, seed=0))
    again = pol.generate(prompts, SamplingParams(max_new_tokens=48, temperature=0.8, seed=0))
    assert [g.token_ids for g in gens] == [g.token_ids for g in again]
    scored = pol.token_logprobs(
        [g.prompt_ids for g in gens], [g.token_ids for g in gens], temperature=0.8
    )
    for g, lp in zip(gens, scored, strict=True):
        assert len(g.token_ids) == 48 and all(math.isfinite(x) for x in g.logprobs)
        assert lp.device.type == "cuda" and lp.dtype == torch.float32
        # bf16 rounding differs between the cached and the full forward: a loose bound
        assert lp.cpu().tolist() == pytest.approx(g.logprobs, abs=0.15)
    greedy_gens = pol.generate(prompts[:4], greedy(32))
    for p, g in zip(prompts[:4], greedy_gens, strict=True):
        assert pol.generate([p], greedy(32))[0].token_ids[:8] == g.token_ids[:8]


@pytest.mark.gpu
@needs_cuda
def test_gpu_one_optimizer_step_lowers_the_loss() -> None:
    pol = Policy.builtin(GPTConfig(max_seq_len=128), seed=0, dtype=torch.float32)
    tok = pol.tokenizer
    prompts = [tok.encode_prompt(f"def f{i}(x):") for i in range(16)]
    targets = [tok.encode(" return x + 1\n", eos=True) for _ in range(16)]
    opt = torch.optim.AdamW(pol.model.parameters(), lr=1e-3)
    pol.model.train()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = -torch.cat(pol.token_logprobs(prompts, targets)).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        after = -torch.cat(pol.token_logprobs(prompts, targets)).mean()
    assert torch.isfinite(loss) and float(after) < float(loss)
