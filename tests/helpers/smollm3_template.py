"""SmolLM3's chat template, condensed: its default instructions shortened, the logic as the real
one has it (llama.cpp's models/templates/HuggingFaceTB-SmolLM3-3B.jinja; test_chat_template_smollm3.py
checks the two render the same conversations alike). Thinking on by default ("/think"), off with
enable_thinking=False or "/no_think" in the system message (an empty thought closed in the prompt)."""

FIXTURE = """{%- if enable_thinking is not defined -%}{%- set enable_thinking = true -%}{%- endif -%}
{%- set reasoning_mode = "/think" if enable_thinking else "/no_think" -%}
{{- "<|im_start|>system\\n" -}}
{%- if messages[0].role == "system" -%}
    {%- set system_message = messages[0].content -%}
    {%- if "/no_think" in system_message -%}{%- set reasoning_mode = "/no_think" -%}
    {%- elif "/think" in system_message -%}{%- set reasoning_mode = "/think" -%}{%- endif -%}
    {%- set custom_instructions = system_message.replace("/no_think", "").replace("/think", "").rstrip() -%}
{%- endif -%}
{{- "## Metadata\\n\\nKnowledge Cutoff Date: June 2025\\nReasoning Mode: " + reasoning_mode + "\\n\\n" -}}
{{- "## Custom Instructions\\n\\n" -}}
{%- if custom_instructions -%}{{- custom_instructions + "\\n\\n" -}}
{%- elif reasoning_mode == "/think" -%}{{- "You are SmolLM. Think first: <think> Thought </think> Solution.\\n\\n" -}}
{%- else -%}{{- "You are SmolLM.\\n\\n" -}}{%- endif -%}
{{- "<|im_end|>\\n" -}}
{%- for message in messages -%}
    {%- set content = message.content if message.content is string else "" -%}
    {%- if message.role == "user" -%}{{ "<|im_start|>user\\n" + content + "<|im_end|>\\n" }}
    {%- elif message.role == "assistant" -%}
        {{ "<|im_start|>assistant\\n" + ("" if reasoning_mode == "/think" else "<think>\\n\\n</think>\\n")
           + content.lstrip("\\n") + "<|im_end|>\\n" }}
    {%- elif message.role == "tool" -%}{{ "<|im_start|>user\\n" + content + "<|im_end|>\\n" }}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{ "<|im_start|>assistant\\n" + ("" if reasoning_mode == "/think" else "<think>\\n\\n</think>\\n") }}
{%- endif -%}"""
