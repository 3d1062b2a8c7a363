"""The HTTP server of `infer serve`: OpenAI's, Anthropic's, ollama's and llama-server's APIs over one
engine per model.  cli/serve.py, the Typer command, builds the app from here and runs it on
uvicorn; nothing here knows the terminal.

A generation request's path: http_protocol.py (the connection, its deadline) -> the front door
(openai_server.FrontDoor: the API key, request counts) -> with several models, model_router.py
(the body parsed once, the model it names leased from model_pool.py) -> the route's adapter
(openai_server.OpenAIAPI or ollama_api.OllamaAPI), which checks its API's fields and builds a
service.Generation -> service.EngineService.start: plan the chat, encode the prompt, constrain
and compile its grammar, fit max_tokens to the context, admit it past the queue, stream the
engine's events -> the adapter renders the Stream in its API's shapes (SSE, NDJSON or one object).

The modules:

- service.py: the Service seam (a Protocol, as backends/base.py's Runner is the engine's), the
  request types the adapters build (Generation and its prompts), EngineService; ServerConfig.
- openai_server.py: OpenAI's routes (/v1/chat/completions, /v1/completions, /v1/models, /health,
  /metrics), the front door, and create_app, the app of one model with every route.
- openai_request.py: OpenAI's fields checked and turned into a Job (SamplingParams and what the
  route needs); APIError, the error every route raises, its param from InferError.field.
- openai_chat.py: a chat's tools and reasoning: the plan of its prompt and the split of its reply.
- openai_logprobs.py: logprobs in OpenAI's shapes.
- responses_api.py, responses_input.py: OpenAI's Responses API (/v1/responses): a request read as
  the chat request it amounts to, the reply as output items or their events; the responses each
  model's service remembers (previous_response_id, GET / DELETE /v1/responses/{id}).
- ollama_api.py: ollama's routes (/api/chat, /api/generate over the service; /api/tags, /api/show,
  /api/pull, ...).
- anthropic_api.py, anthropic_request.py: Anthropic's Messages API (/v1/messages, count_tokens):
  its request as the OpenAI chat route's ChatPrompt, the same ChatReply as content blocks, its
  event stream and error envelope; openapi_anthropic.py their OpenAPI paths and schemas.
- embeddings_api.py, tokenize_api.py: /v1/embeddings and /api/embed(dings); /tokenize, /detokenize.
- llama_api.py, llama_infill.py, llama_props.py: llama-server's native routes: /completion(s) and
  /infill (its FIM prompt); /props, /slots, /apply-template (openapi_llama.py: their OpenAPI part).
- model_router.py, model_pool.py: several models from one server, each loaded when a request
  names it and unloaded when idle.
- openapi.py: the OpenAPI document at /openapi.json (openapi_responses.py: the Responses API's part;
  openapi_schema.py: the pieces every part is built from).
- error_shapes.py: which API's error shape a path's errors take (front door, router, handlers).
- cors.py: the CORS rule (--cors: loopback origins by default, as ollama; '*' or exact origins).
- server_metrics.py: the Prometheus text at /metrics.
- http_protocol.py: uvicorn's HTTP/1.1 protocol with a deadline on each request (--timeout).
- webui.py and webui/: the chat page a browser gets at GET /.

Another API plugs in as ollama's, Anthropic's and the others do: a module with a class over a Service whose routes check that API's fields, build
a Generation (a ChatPrompt for messages, a TextPrompt or TokenPrompt for a raw prompt; a Job from
SamplingParams), call service.start and collect or stream the Stream in the API's shapes, mapping
APIError to the API's error shape (error_shapes.py); create_app adds its routes,
model_router.MODEL_ROUTES the paths whose body names a model, and openapi.py their schemas.  Nothing in the service changes.
"""
