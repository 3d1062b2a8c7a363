"""The engine: requests in, event streams out, over one model on any backend. It knows no terminal
and no HTTP (the front ends are in cli/).

Modules, by what they are for:

- Running requests: `engine.py` (Engine, EngineConfig: many requests at once over one model, a
  stream of events per request), `request.py` (one request's state and its events), `scheduler.py`
  (continuous batching: what the next forward pass computes), `block_manager.py` (the paged KV
  cache's bookkeeping and the prefix cache), `llm.py` (LLM: a model loaded on a backend with its
  tokenizer and chat template), `benchmark.py` (what `infer bench` measures).
- Sampling and stopping: `sampler.py` (llama.cpp's default chain), `stop.py` (stop strings in a
  stream), `grammar.py` (structured output through llguidance), `speculative.py` (prompt-lookup
  drafts), `draft.py` (a draft model's drafts), `pooling.py` (embeddings).
- Chat: `chat_template.py` (Jinja templates, sandboxed), `conversation.py` (messages fitted to the
  context), `tool_calls.py` (tools through the template, replies parsed back; `xml_tool_calls.py` its
  XML family, `gemma4_format.py` Gemma 4's format and built-in template), `reasoning.py` (thinking
  kept apart from the answer).
- Tokenizing, the same ids and text as llama.cpp for every vocabulary type it reads:
  `tokenizer.py` (the GGUF tokenizer and VOCAB_TYPES), `spm.py`, `bpe.py`, `wpm.py`, `ugm.py`,
  `rwkv.py`, `plamo2.py` (one per vocabulary type), `pretokenizers.py` (every pre-tokenizer name
  llama.cpp knows), `regex_split.py` (their regexes compiled for numba), `pieces.py`,
  `token_table.py`, `special_tokens.py`, `detokenizer.py`, `tokenizer_error.py`;
  `hf_tokenizer.py` (a model folder's tokenizer.json) and `tokenizer_json.py` (a GGUF vocabulary
  written as tokenizer.json).

Notes.

Paged KV cache (block_manager.py; the pools are the backends'): a preallocated pool of 16-token
blocks, per-sequence block tables and reference counts; attention reads K/V through the block
table in place. Gemma 3's sliding-window layers have their own pool and drop blocks that leave the
window (at most window/16 + 1 per sequence), so long contexts cost only the global layers' memory.
Pool size: `--ctx` x `--parallel` by default, or `--kv-memory`; on the cpu backend its pages are
zeroed by the OS when first written (ordinary pages, not huge ones), so it takes memory only as far
as it is used. `--cache-type-k q8_0 --cache-type-v q8_0` keep K and V as llama.cpp's q8_0 blocks
(34 bytes per 32 values instead of 64), so the same memory holds 1.9x the tokens (cpu and llama.cpp
backends).

Prefix caching: full blocks are named by a chained hash of their tokens (and the model); a prompt
starting with named blocks takes them instead of recomputing (a conversation's next turn prefills
only its new tokens); a shared block is copied before a sequence writes into it; blocks nobody
holds stay findable until evicted, least recently freed first.

Continuous batching (scheduler.py): every step is one forward pass over all running sequences:
decode tokens first, then prefill chunks of waiting prompts under a 512-token budget
(EngineConfig.max_batch_tokens), so a long prompt never stalls the others. When the pool runs out,
the newest sequence is preempted and recomputed later. Finished or cancelled sequences free their
blocks at once; a server client that disconnects cancels its sequence.

Batching changes no result: every row of a forward pass is computed exactly as it would be alone
(the quantized matmul's per-row arithmetic does not depend on the batch), so concurrent greedy
requests produce the same tokens as one at a time (tests/test_engine.py). F32/F16/BF16 weight
matrices too: they are multiplied by infer's own kernel, not BLAS, whose summation order depends
on the batch size (BLAS prefill was ~1.8x faster on them). An embedding computed beside decoding
streams is the same vector, to the bit, as alone.

Embeddings (pooling.py): the model's final hidden states (after the output norm, what llama.cpp
returns) pooled as llama.cpp pools them: the GGUF's `pooling_type` when it has one, else the
server's `--pooling` (`mean` by default, `cls`: the first token, `last`: the last one). Against
llama-cpp-python's `embed` with the same pooling: cosine distance on the embedded model 4e-5 to
3e-4 (mean) and up to 1.7e-3 (last token; llama.cpp's own flash-attention path is 3.4e-3 from its
default one there), under 2e-5 on the tiny model of every architecture.

Structured output (grammar.py): llguidance (llama.cpp's own optional grammar backend) gives each
step the tokens that may follow, and sampling starts from those alone, before penalties, top-k,
top-p, min-p and temperature; it runs per request inside continuous batching. JSON between tokens
may hold at most llama.cpp's whitespace (a space, or one or two newlines and up to 20 spaces), so a
small model cannot indent forever. Free decimals are not capped (llama.cpp's own JSON grammars cap
them at 16 digits): a small model may write `0.000...` up to `max_tokens`; a schema's `multipleOf`
keeps a number short. As llama.cpp reads schemas, an object that lists `properties` and says
nothing of others takes no others, and an integer without bounds has at most 16 digits.

Tool calls (tool_calls.py): the tools reach the model through its own chat template (its `tools`
variable) and the reply is read in the syntax of the template's family: Qwen2.5/Qwen3/Hermes
`<tool_call>` JSON, Llama 3.x JSON, Mistral `[TOOL_CALLS]`, DeepSeek-R1's tool-call tokens,
Qwen3-Coder's and Qwen3.5's XML (`<function=...><parameter=...>`, xml_tool_calls.py: values are
text, typed back by the tool's schema). A template that knows no tools (the embedded Gemma's), or
writes a syntax not read here (Mistral Small 3.2's `[ARGS]`, DeepSeek V3.1's), gets llama.cpp's generic format: the
tools described in the system turn and the reply held to `{"tool_calls": [...]}` or
`{"response": "..."}`. `required` and a named function are enforced with a grammar, so the call
always parses; `auto` leaves a native family's model free until it starts a call (its marker), and
from there holds the call to the same grammar (a lazy grammar, as llama.cpp's). A forced tool call
leaves no room to think: its grammar starts at the call.

Reasoning (reasoning.py): templates with `<think>` (DeepSeek-R1 distills, Qwen3, QwQ) have their
thinking returned apart, also when the template opens the `<think>` itself. gpt-oss's harmony
format is read the same way: its `analysis` channel is the thinking, `final` (and `commentary`
text) the answer, the markers dropped; `reasoning_effort` goes to its template. Its tool calls
(harmony's `to=functions.NAME` messages) are not parsed yet: they come back as text.

Speculative decoding (speculative.py, draft.py): prompt lookup is llama.cpp's `ngram-simple`: when
the last n tokens (6; llama.cpp's default is 12) appeared earlier in the prompt or the reply, the
up to `draft_max` (8) tokens that followed them are proposed, and the next step computes the
sampled token and the draft together. Each drafted position is sampled with the request's own
sampler (temperature, seed, penalties, grammar) and the draft is kept while it agrees, plus the
first token that does not: every token is the one plain decoding would have produced from the same
logits, so greedy output is token for token the same and a seed draws the same reply. The K/V of
rejected tokens are dropped and their blocks given back. A step verifies at most 32 tokens across
its streams (speculative.STEP_TOKENS), so drafts shrink as more streams decode together. A draft
model must share the target's vocabulary (llama.cpp's check: the same BOS/EOS, sizes within 128,
the same text for every token); it has its own runner and paged KV cache, drafts greedily for every
decoding sequence in shared passes, stops early where its top token's probability is under
`draft_p_min`, and rolls its cache back to what the target kept. Measurements:
scripts/BENCHMARKS.md.

Tokenizers: every vocabulary llama.cpp reads tokenizes as llama.cpp tokenizes it (each of its own
test files and vectors, and random text, give llama.cpp's ids: tests/test_vocabularies.py), and no
slower than llama.cpp on any of them (scripts/bench_tokenize.py); a pre-tokenizer name llama.cpp
does not know is refused, as llama.cpp refuses it.
"""

from infer.quant.numba_cache import lock_cache_writes

lock_cache_writes()  # the tokenizers' kernels compile and cache too (quant/numba_cache.py)
