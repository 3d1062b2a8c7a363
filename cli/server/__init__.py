"""The HTTP server of `infer serve`: OpenAI's and ollama's APIs (and llama.cpp's /tokenize) over
one engine per model.  cli/serve.py, the Typer command, builds the app from here and runs it on
uvicorn; nothing here knows the terminal.

The modules:

- openai_server.py: the app of one model (create_app), its front door (API key, request counts)
  and the OpenAI routes /v1/chat/completions, /v1/completions, /v1/models, /health, /metrics.
- openai_request.py: an OpenAI body's fields checked and turned into a Job (SamplingParams and
  what the route needs); APIError, the error every route raises.
- openai_chat.py: a chat's tools and reasoning: the plan of its prompt and the split of its reply.
- openai_logprobs.py: logprobs in OpenAI's shapes.
- ollama_api.py: ollama's routes (/api/chat, /api/generate, /api/tags, ...).
- embeddings_api.py, tokenize_api.py: /v1/embeddings and /api/embed(dings); /tokenize, /detokenize.
- model_router.py, model_pool.py: several models from one server, each loaded when a request
  names it and unloaded when idle.
- openapi.py: the OpenAPI document at /openapi.json.
- server_metrics.py: the Prometheus text at /metrics.
- http_protocol.py: uvicorn's HTTP/1.1 protocol with a deadline on each request (--timeout).
- webui.py and webui/: the chat page a browser gets at GET /.
"""
