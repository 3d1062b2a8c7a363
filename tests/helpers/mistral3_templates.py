"""Mistral 3's chat templates, condensed: Ministral 3 Reasoning's (llama.cpp's models/templates/
mistralai-Ministral-3-14B-Reasoning-2512.jinja) and Mistral Small 3.2's
(Mistral-Small-3.2-24B-Instruct-2506.jinja), their default system prompts shortened and image and
thinking blocks left out, the logic as the real ones have it (test_chat_template_mistral3.py checks
that they render the same conversations alike). Tool calls as [TOOL_CALLS]NAME[ARGS]{json};
Ministral's system prompt asks for a [THINK] thought first."""

MINISTRAL = """{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {{- '[SYSTEM_PROMPT]' + messages[0]['content'] + '[/SYSTEM_PROMPT]' -}}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
    {{- '[SYSTEM_PROMPT]Think first: [THINK]thoughts[/THINK] then answer.[/SYSTEM_PROMPT]' }}
{%- endif %}
{%- if tools is defined and tools is not none and tools|length > 0 %}
    {{- '[AVAILABLE_TOOLS]' + (tools| tojson) + '[/AVAILABLE_TOOLS]' }}
{%- endif %}
{%- for message in loop_messages %}
    {%- if message['role'] == 'user' %}
        {{- '[INST]' + message['content'] + '[/INST]' }}
    {%- elif message['role'] == 'assistant' %}
        {%- if message['content'] is string and message['content'] != '' %}
            {{- message['content'] }}
        {%- endif %}
        {%- if message['tool_calls'] is defined and message['tool_calls'] is not none %}
            {%- for tool in message['tool_calls'] %}
                {%- set arguments = tool['function']['arguments'] %}
                {%- if arguments is not string %}
                    {%- set arguments = arguments|tojson|safe %}
                {%- elif arguments == '' %}
                    {%- set arguments = '{}' %}
                {%- endif %}
                {{- '[TOOL_CALLS]' + tool['function']['name'] + '[ARGS]' + arguments }}
            {%- endfor %}
        {%- endif %}
        {{- eos_token }}
    {%- elif message['role'] == 'tool' %}
        {{- '[TOOL_RESULTS]' + message['content']|string + '[/TOOL_RESULTS]' }}
    {%- endif %}
{%- endfor %}"""

SMALL = """{{- bos_token }}
{%- set system_prompt = "You are Mistral Small 3." %}
{%- set loop_messages = messages %}
{%- if not tools is defined %}{%- set tools = none %}{%- endif %}
{%- if messages|length > 0 and messages[0]['role'] == 'system' %}
    {%- set system_prompt = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}
{{- '[SYSTEM_PROMPT]' + system_prompt + '[/SYSTEM_PROMPT]' }}
{%- for message in loop_messages %}
    {%- if message['role'] == 'user' %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- '[AVAILABLE_TOOLS]' + tools|tojson + '[/AVAILABLE_TOOLS]' }}
        {%- endif %}
        {{- '[INST]' + message['content'] + '[/INST]' }}
    {%- elif message['role'] == 'assistant' %}
        {%- if message.get('tool_calls') %}
            {%- for tool_call in message.tool_calls %}
                {{- '[TOOL_CALLS]' + tool_call.function.name }}
                {%- if not tool_call.id is defined or tool_call.id is not string or tool_call.id|length != 9 %}
                    {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
                {%- endif %}
                {{- '[CALL_ID]' + tool_call.id + '[ARGS]' + tool_call['function']['arguments']|tojson }}
            {%- endfor %}
            {{- eos_token }}
        {%- else %}
            {{- message['content'] + eos_token }}
        {%- endif %}
    {%- elif message['role'] == 'tool' %}
        {{- '[TOOL_RESULTS]' + message.tool_call_id + '[TOOL_CONTENT]' + message.content|string + '[/TOOL_RESULTS]' }}
    {%- endif %}
{%- endfor %}"""
