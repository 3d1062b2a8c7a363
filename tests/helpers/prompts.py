"""Prompts in many scripts and shapes (code, CJK, Arabic, emoji, whitespace runs, a chat turn) that
the embedded Gemma's end-to-end tests run against llama.cpp, and the backend tests reuse."""

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "import numpy as np\n\nx = np.arange(10)\nprint(x.",
    "SELECT name, COUNT(*) FROM users GROUP BY",
    "Les trois couleurs du drapeau français sont",
    "Der schnellste Weg nach Berlin ist",
    "El agua hierve a 100 grados",
    "東京は日本の首都で、",
    "我最喜欢的食物是",
    "Столица России —",
    "القاهرة هي عاصمة",
    "भारत की राजधानी",
    "I love pizza 🍕 and tacos 🌮 because",
    "👩‍👩‍👧‍👦 family emoji, then text:",
    "Lots   of    spaces     between      words",
    "\n\n\nNewlines first, then a question: why?",
    "\tTabbed\tcolumns\tof\tdata\n1\t2\t3\n",
    "1, 2, 3, 4, 5, 6, 7,",
    "https://example.com/path?query=1&other=two#frag is a",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "Q: What color is the sky?\nA:",
    "Translate to French: good morning ->",
    "{\"name\": \"Alice\", \"age\": 30, \"city\":",
]
