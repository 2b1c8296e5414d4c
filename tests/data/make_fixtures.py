"""Writes the small dataset fixtures in this folder, in the public schemas of GSM8K, MATH-500,
AIME 2024/2025 and DAPO-Math-17k (rows invented for the tests). Rerun after changing a schema:
``.venv/bin/python tests/data/make_fixtures.py``."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).parent

GSM8K = [
    {
        "question": "A box holds 12 pens. Mia buys 3 boxes and gives away 5 pens. How many pens does she keep?",
        "answer": "She buys 3*12=<<3*12=36>>36 pens.\nShe keeps 36-5=<<36-5=31>>31 pens.\n#### 31",
    },
    {
        "question": "A farm sells eggs at $2 per dozen. How much do 600 dozen cost?",
        "answer": "600 dozen cost 600*2=<<600*2=1200>>1,200 dollars.\n#### 1,200",
    },
    {
        "question": "Tom reads 15 pages a day for 4 days. How many pages does he read?",
        "answer": "He reads 15*4=<<15*4=60>>60 pages.\n#### 60",
    },
]
MATH500 = [
    {
        "problem": "What is $\\frac{1}{2} + \\frac{1}{3}$?",
        "solution": "The sum is $\\frac{3}{6}+\\frac{2}{6}=\\boxed{\\frac{5}{6}}$.",
        "answer": "\\frac{5}{6}",
        "subject": "Prealgebra",
        "level": 1,
        "unique_id": "test/prealgebra/1.json",
    },
    {
        "problem": "Simplify $\\sqrt{8}$.",
        "solution": "$\\sqrt{8}=\\sqrt{4\\cdot 2}=\\boxed{2\\sqrt{2}}$.",
        "answer": "2\\sqrt{2}",
        "subject": "Algebra",
        "level": 2,
        "unique_id": "test/algebra/2.json",
    },
    {
        "problem": "Solve $2x+3=9$ for $x$.",
        "solution": "$2x=6$ so $x=\\boxed{3}$.",
        "answer": "3",
        "subject": "Algebra",
        "level": 1,
        "unique_id": "test/algebra/3.json",
    },
]
AIME2024 = [  # Maxwell-Jia/AIME_2024 style: capitalised columns, integer answers
    {
        "ID": "2024-I-1",
        "Problem": "Find the remainder when $7^{4}$ is divided by $100$.",
        "Solution": "$7^4=2401$.",
        "Answer": 1,
    },
    {
        "ID": "2024-I-2",
        "Problem": "How many positive divisors does $360$ have?",
        "Solution": "$360=2^3 3^2 5$.",
        "Answer": 24,
    },
]
AIME2025 = [  # yentinglin/aime_2025 style: lower-case columns, string answers
    {
        "id": 0,
        "problem": "Compute $11 \\cdot 3$.",
        "solution": "33",
        "answer": "033",
        "url": "https://example.invalid/1",
        "year": 2025,
    },
    {
        "id": 1,
        "problem": "Compute $2^{10} \\bmod 1000$.",
        "solution": "1024",
        "answer": "24",
        "url": "https://example.invalid/2",
        "year": 2025,
    },
]
AIME2025_Q = [  # opencompass/AIME2025 style: question/answer only
    {"question": "What is $6 \\cdot 7$?", "answer": "42"},
    {"question": "What is $100 - 1$?", "answer": "99"},
]
DAPO_TEMPLATE = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)
DAPO = [
    {
        "data_source": "math_dapo",
        "prompt": [{"content": DAPO_TEMPLATE.format(p), "role": "user"}],
        "ability": "MATH",
        "reward_model": {"ground_truth": a, "style": "rule-math"},
        "extra_info": {"index": f"00000000-0000-0000-0000-00000000000{i}"},
    }
    for i, (p, a) in enumerate(
        [("What is $3^4$?", "81"), ("How many primes are below $20$?", "8"), ("What is $17 \\cdot 3$?", "51")]
    )
]
GENERIC = [
    {"uid": "q1", "query": "What is 2+2?", "target": "4", "difficulty": "easy"},
    {
        "uid": "q2",
        "query": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 3*3?"}],
        "target": "9",
        "difficulty": "easy",
    },
]


def write_jsonl(name, rows):
    with open(HERE / name, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    write_jsonl("gsm8k.jsonl", GSM8K)
    write_jsonl("math500.jsonl", MATH500)
    write_jsonl("aime2024.jsonl", AIME2024)
    write_jsonl("aime2025.jsonl", AIME2025)
    write_jsonl("aime2025_question.jsonl", AIME2025_Q)
    write_jsonl("generic.jsonl", GENERIC)
    pq.write_table(pa.Table.from_pylist(DAPO), HERE / "dapo_math.parquet")
