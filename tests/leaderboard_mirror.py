#!/usr/bin/env python3
"""An offline stand-in for the Open LLM Leaderboard v2's data (lm-eval's `leaderboard` group), for the tests and
for tests/golden/make_leaderboard.py: every dataset its YAMLs read, under its hub name, with that dataset's
schema (column names and types, configs and splits) and a few rows of made-up text of our own, none copied from
the datasets. Also a test-only, untrained nltk `punkt_tab`, which lm-eval's IFEval code needs and which cannot be
downloaded here.

The datasets are written as the `datasets` library's own cache (HF_DATASETS_CACHE's layout:
`<namespace>___<name>/<config>/0.0.0/<hash>/`, one `<name>-<split>.arrow` per split and the dataset_info.json
beside them). Under HF_HUB_OFFLINE=1, `datasets.load_dataset("SaylorTwift/bbh", "boolean_expressions")` finds no
hub and loads the newest cached version (datasets.packaged_modules.cache): lm-eval's own YAMLs, unchanged, read
these rows, so `--tasks leaderboard` itself runs on them.

| hub dataset | configs | splits | read by |
|---|---|---|---|
| SaylorTwift/bbh | the 24 BBH tasks | test | leaderboard_bbh_* (3-shot from the YAMLs' own samples) |
| Idavidrein/gpqa | gpqa_diamond, gpqa_extended, gpqa_main | train | leaderboard_gpqa_* (its CSV's 80 columns) |
| DigitalLearningGmbH/MATH-lighteval | algebra, ..., precalculus | train, test | leaderboard_math_*_hard (Level 5 only) |
| TAUR-Lab/MuSR | default | murder_mysteries, object_placements, team_allocation | leaderboard_musr_* |
| TIGER-Lab/MMLU-Pro | default | test, validation (the 5-shot pool) | leaderboard_mmlu_pro |
| wis-k/instruction-following-eval | default | train | leaderboard_ifeval |

The untrained punkt_tab (`nltk_data/tokenizers/punkt_tab/english/`, four empty parameter files) is a valid Punkt
model with nothing learned: it splits sentences at every period, abbreviations included. It only lets lm-eval's
IFEval code load and run offline; a real evaluation needs nltk's own punkt_tab (docs/tasks.md).

usage: python tests/leaderboard_mirror.py OUT_DIR
    (writes OUT_DIR/hf-datasets, to use as HF_DATASETS_CACHE, and OUT_DIR/nltk_data, to use as NLTK_DATA)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

CACHE_HASH = "raylm-test-mirror"  # the cache's version folder name; the hub's would be a commit's hash
PUNKT_FILES = ("collocations.tab", "sent_starters.txt", "abbrev_types.txt", "ortho_context.tab")

# BBH: per task, two (input, target) rows; the target is one of the task YAML's doc_to_choice.
BBH: dict[str, list[tuple[str, str]]] = {
    "boolean_expressions": [("True or not ( False and True ) is", "True"), ("not True and ( True or False ) is",
                                                                            "False")],
    "causal_judgement": [
        ("How would a typical person answer each of the following questions about causation?\nA baker left the oven "
         "on overnight, and the night guard forgot to check the kitchen. The bread burned. Did the baker cause the "
         "bread to burn?\nOptions:\n- Yes\n- No", "Yes"),
        ("How would a typical person answer each of the following questions about causation?\nTwo gardeners water "
         "the same plant; either watering alone is enough. The plant thrives. Did the second gardener cause the "
         "plant to thrive?\nOptions:\n- Yes\n- No", "No")],
    "date_understanding": [
        ("Yesterday was 03/14/2021. What is the date tomorrow in MM/DD/YYYY?\nOptions:\n(A) 03/16/2021\n"
         "(B) 03/15/2021\n(C) 04/16/2021\n(D) 03/16/2020\n(E) 02/16/2021\n(F) 03/17/2021", "(A)"),
        ("The concert was on 07/01/2019, two days ago. What is the date today in MM/DD/YYYY?\nOptions:\n"
         "(A) 07/02/2019\n(B) 07/03/2019\n(C) 06/29/2019\n(D) 07/03/2018\n(E) 08/03/2019\n(F) 07/04/2019", "(B)")],
    "disambiguation_qa": [
        ("In the following sentences, explain the antecedent of the pronoun (which thing the pronoun refers to), "
         "or state that it is ambiguous.\nSentence: The pilot thanked the mechanic because he fixed the engine.\n"
         "Options:\n(A) The pilot fixed the engine\n(B) The mechanic fixed the engine\n(C) Ambiguous", "(B)"),
        ("In the following sentences, explain the antecedent of the pronoun (which thing the pronoun refers to), "
         "or state that it is ambiguous.\nSentence: The editor met the writer before she left.\nOptions:\n"
         "(A) The editor left\n(B) The writer left\n(C) Ambiguous", "(C)")],
    "formal_fallacies": [
        ("\"Every member of the chess club is a student. Nobody who is a student is a teacher. Hence, no member of "
         "the chess club is a teacher.\"\nIs the argument, given the explicitly stated premises, deductively valid "
         "or invalid?\nOptions:\n- valid\n- invalid", "valid"),
        ("\"Some painters are poets. Some poets are singers. Hence, some painters are singers.\"\nIs the argument, "
         "given the explicitly stated premises, deductively valid or invalid?\nOptions:\n- valid\n- invalid",
         "invalid")],
    "geometric_shapes": [
        ("This SVG path element <path d=\"M 10.00,10.00 L 40.00,10.00 L 40.00,40.00 L 10.00,40.00 L 10.00,10.00\"/> "
         "draws a\nOptions:\n(A) circle\n(B) heptagon\n(C) hexagon\n(D) kite\n(E) line\n(F) octagon\n(G) pentagon\n"
         "(H) rectangle\n(I) sector\n(J) triangle\n(K) trapezoid", "(H)"),
        ("This SVG path element <path d=\"M 5.00,5.00 L 25.00,45.00 L 45.00,5.00 L 5.00,5.00\"/> draws a\nOptions:\n"
         "(A) circle\n(B) heptagon\n(C) hexagon\n(D) kite\n(E) line\n(F) octagon\n(G) pentagon\n(H) rectangle\n"
         "(I) sector\n(J) triangle\n(K) trapezoid", "(J)")],
    "hyperbaton": [
        ("Which sentence has the correct adjective order:\nOptions:\n(A) old small wooden boat\n"
         "(B) small old wooden boat", "(B)"),
        ("Which sentence has the correct adjective order:\nOptions:\n(A) lovely round green ball\n"
         "(B) green round lovely ball", "(A)")],
    "logical_deduction_five_objects": [
        ("The following paragraphs each describe a set of five objects arranged in a fixed order. The statements "
         "are logically consistent within each paragraph. On a shelf, there are five jars: a red, a blue, a green, "
         "a white and a black one. The red jar is the leftmost. The black jar is the rightmost. The blue jar is "
         "second from the left. The white jar is left of the green jar.\nOptions:\n(A) The red jar is the leftmost\n"
         "(B) The blue jar is the leftmost\n(C) The green jar is the leftmost\n(D) The white jar is the leftmost\n"
         "(E) The black jar is the leftmost", "(A)"),
        ("The following paragraphs each describe a set of five objects arranged in a fixed order. The statements "
         "are logically consistent within each paragraph. Five runners finished a race: Ann, Ben, Cal, Dee and Eve. "
         "Ann finished first. Eve finished last. Ben finished after Dee. Cal finished second.\nOptions:\n"
         "(A) Ann finished third\n(B) Ben finished third\n(C) Cal finished third\n(D) Dee finished third\n"
         "(E) Eve finished third", "(D)")],
    "logical_deduction_seven_objects": [
        ("The following paragraphs each describe a set of seven objects arranged in a fixed order. The statements "
         "are logically consistent within each paragraph. Seven books stand in a row, numbered by color: amber, "
         "beige, coral, denim, ebony, fawn and gold, in that order from the left.\nOptions:\n(A) The amber book is "
         "the third from the left\n(B) The beige book is the third from the left\n(C) The coral book is the third "
         "from the left\n(D) The denim book is the third from the left\n(E) The ebony book is the third from the "
         "left\n(F) The fawn book is the third from the left\n(G) The gold book is the third from the left", "(C)"),
        ("The following paragraphs each describe a set of seven objects arranged in a fixed order. The statements "
         "are logically consistent within each paragraph. Seven birds sit on a wire. The owl is the rightmost. The "
         "crow is left of the owl and right of everyone else.\nOptions:\n(A) The owl is the second from the right\n"
         "(B) The crow is the second from the right\n(C) The wren is the second from the right\n(D) The jay is the "
         "second from the right\n(E) The lark is the second from the right\n(F) The hawk is the second from the "
         "right\n(G) The dove is the second from the right", "(B)")],
    "logical_deduction_three_objects": [
        ("The following paragraphs each describe a set of three objects arranged in a fixed order. The statements "
         "are logically consistent within each paragraph. A shelf holds a mug, a vase and a lamp. The vase is "
         "right of the lamp. The mug is left of the lamp.\nOptions:\n(A) The mug is the leftmost\n"
         "(B) The vase is the leftmost\n(C) The lamp is the leftmost", "(A)"),
        ("The following paragraphs each describe a set of three objects arranged in a fixed order. The statements "
         "are logically consistent within each paragraph. Three cars are parked: a van, a taxi and a bus. The bus "
         "is the rightmost. The van is right of the taxi.\nOptions:\n(A) The van is the leftmost\n"
         "(B) The taxi is the leftmost\n(C) The bus is the leftmost", "(B)")],
    "movie_recommendation": [
        ("Find a movie similar to The Sky Tower, Harbor Lights, Midnight Train, River of Stars:\nOptions:\n"
         "(A) Ocean Echo\n(B) Paper Moonrise\n(C) The Quiet Forge\n(D) Glass Orchard\n(E) Winter Parade\n"
         "(F) Copper Island", "(C)"),
        ("Find a movie similar to Desert Bloom, The Last Lantern, Silver Creek:\nOptions:\n(A) Hollow Bells\n"
         "(B) Iron Meadow\n(C) Lantern Bay\n(D) Crimson Pier\n(E) The Long Thaw\n(F) Velvet Road", "(E)")],
    "navigate": [
        ("If you follow these instructions, do you return to the starting point? Always face forward. Take 3 steps "
         "forward. Take 3 steps backward.\nOptions:\n- Yes\n- No", "Yes"),
        ("If you follow these instructions, do you return to the starting point? Turn right. Take 5 steps. Turn "
         "left. Take 2 steps.\nOptions:\n- Yes\n- No", "No")],
    "object_counting": [("I have a kettle, two spoons, a fork, and a plate. How many objects do I have?", "5"),
                        ("I have a cello, a trumpet, a carrot, and a drum. How many musical instruments do I have?",
                         "3")],
    "penguins_in_a_table": [
        ("Here is a table where the first line is a header and each subsequent line is a penguin:  name, age, "
         "height (cm), weight (kg) Pip, 4, 60, 12 Nib, 9, 75, 14 Tux, 2, 55, 10  How many penguins are older than "
         "3?\nOptions:\n(A) 0\n(B) 1\n(C) 2\n(D) 3\n(E) 4", "(C)"),
        ("Here is a table where the first line is a header and each subsequent line is a penguin:  name, age, "
         "height (cm), weight (kg) Pip, 4, 60, 12 Nib, 9, 75, 14 Tux, 2, 55, 10  Which penguin is the tallest?\n"
         "Options:\n(A) Pip\n(B) Nib\n(C) Tux\n(D) Gus\n(E) Ola", "(B)")],
    "reasoning_about_colored_objects": [
        ("On the desk, you see a green cup, a yellow pen and a grey notebook. What color is the pen?\nOptions:\n"
         "(A) red\n(B) orange\n(C) yellow\n(D) green\n(E) blue\n(F) brown\n(G) magenta\n(H) fuchsia\n(I) mauve\n"
         "(J) teal\n(K) turquoise\n(L) burgundy\n(M) silver\n(N) gold\n(O) black\n(P) grey\n(Q) purple\n(R) pink",
         "(C)"),
        ("On the floor, there is a pink ball, a black shoe and a pink hat. How many pink items are there?\n"
         "Options:\n(A) zero\n(B) one\n(C) two\n(D) three\n(E) four\n(F) five\n(G) six\n(H) seven\n(I) eight\n"
         "(J) nine\n(K) ten\n(L) eleven\n(M) twelve\n(N) thirteen\n(O) fourteen\n(P) fifteen\n(Q) sixteen",
         "(C)")],
    "ruin_names": [
        ("Which of the following is a humorous edit of this artist or movie name: 'the moonwalkers'?\nOptions:\n"
         "(A) the moonwalkerz\n(B) the spoonwalkers\n(C) the moonwalkers\n(D) thee moonwalkers\n(E) the monwalkers\n"
         "(F) the moonwalker", "(B)"),
        ("Which of the following is a humorous edit of this artist or movie name: 'river song'?\nOptions:\n"
         "(A) river sing\n(B) rivr song\n(C) liver song\n(D) river songs\n(E) riverr song\n(F) rive song", "(C)")],
    "salient_translation_error_detection": [
        ("The following translations from German to English contain a particular error. Source: Der kleine Hafen "
         "liegt im Norden der Insel.\nTranslation: The small harbor lies in the south of the island.\nThe "
         "translation contains an error pertaining to\nOptions:\n(A) Modifiers or Adjectives\n(B) Numerical Values\n"
         "(C) Negation or Antonyms\n(D) Named Entities\n(E) Dropped Content\n(F) Facts", "(C)"),
        ("The following translations from German to English contain a particular error. Source: Die Brücke wurde "
         "1910 gebaut.\nTranslation: The bridge was built in 1901.\nThe translation contains an error pertaining to\n"
         "Options:\n(A) Modifiers or Adjectives\n(B) Numerical Values\n(C) Negation or Antonyms\n"
         "(D) Named Entities\n(E) Dropped Content\n(F) Facts", "(B)")],
    "snarks": [
        ("Which statement is sarcastic?\nOptions:\n(A) Great, the printer jammed again right before my deadline\n"
         "(B) Bad luck, the printer jammed again right before my deadline", "(A)"),
        ("Which statement is sarcastic?\nOptions:\n(A) Waiting an hour in the rain was not fun\n"
         "(B) Waiting an hour in the rain was so much fun", "(B)")],
    "sports_understanding": [("Is the following sentence plausible? \"The goalkeeper caught the ball in the penalty "
                              "area.\"", "yes"),
                             ("Is the following sentence plausible? \"The sprinter scored a touchdown in the "
                              "swimming final.\"", "no")],
    "temporal_sequences": [
        ("Today, Nora went to the bakery. Between what times could they have gone?\nWe know that:\nNora woke up at "
         "7am.\nNora was at work from 9am to 5pm.\nThe bakery was closed after 6pm.\nBetween what times could Nora "
         "have gone to the bakery?\nOptions:\n(A) 7am to 9am\n(B) 9am to 12pm\n(C) 12pm to 5pm\n(D) 6pm to 8pm",
         "(A)"),
        ("Today, Omar went to the library. Between what times could they have gone?\nWe know that:\nOmar woke up "
         "at 6am.\nOmar was cooking from 6am to 10am.\nOmar was at the gym from 11am to 8pm.\nBetween what times "
         "could Omar have gone to the library?\nOptions:\n(A) 6am to 10am\n(B) 10am to 11am\n(C) 11am to 3pm\n"
         "(D) 3pm to 8pm", "(B)")],
    "tracking_shuffled_objects_five_objects": [
        ("Alice, Bob, Claire, Dave, and Eve are holding a hat each: red, blue, green, white and black. Alice and Bob "
         "swap hats. Then Claire and Dave swap hats. At the end, Alice has the\nOptions:\n(A) red hat\n"
         "(B) blue hat\n(C) green hat\n(D) white hat\n(E) black hat", "(B)"),
        ("Alice, Bob, Claire, Dave, and Eve each hold a book. Dave and Eve swap books. At the end, Eve has the book "
         "Dave started with.\nOptions:\n(A) Alice's\n(B) Bob's\n(C) Claire's\n(D) Dave's\n(E) Eve's", "(D)")],
    "tracking_shuffled_objects_seven_objects": [
        ("Seven friends each hold a card numbered 1 to 7 in order. The first and the last swap cards. At the end, "
         "the first friend holds card\nOptions:\n(A) 1\n(B) 2\n(C) 3\n(D) 4\n(E) 5\n(F) 6\n(G) 7", "(G)"),
        ("Seven dancers stand in a line with partners 1 to 7. Nobody swaps. At the end, the third dancer dances "
         "with partner\nOptions:\n(A) 1\n(B) 2\n(C) 3\n(D) 4\n(E) 5\n(F) 6\n(G) 7", "(C)")],
    "tracking_shuffled_objects_three_objects": [
        ("Alice, Bob, and Claire hold a pear, a plum and a fig. Alice and Claire swap. At the end, Alice has the\n"
         "Options:\n(A) pear\n(B) plum\n(C) fig", "(C)"),
        ("Alice, Bob, and Claire play positions: goalie, wing and center. Bob and Claire swap. At the end, Bob "
         "plays\nOptions:\n(A) goalie\n(B) wing\n(C) center", "(C)")],
    "web_of_lies": [
        ("Question: Mara tells the truth. Ivo says Mara lies. Does Ivo tell the truth?", "No"),
        ("Question: Lena lies. Theo says Lena lies. Does Theo tell the truth?", "Yes")],
}

# GPQA's CSV columns in file order with the types the hub infers for them; the made-up rows fill the ones the
# tasks and a reader of the data would look at, the rest are null.
GPQA_COLUMNS: list[tuple[str, str]] = [
    *[(f"Pre-Revision {c}", "string") for c in ("Question", "Correct Answer", "Incorrect Answer 1",
                                                "Incorrect Answer 2", "Incorrect Answer 3", "Explanation")],
    ("Self-reported question-writing time (minutes)", "float64"),
    *[(c, "string") for c in ("Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2",
                              "Incorrect Answer 3", "Explanation", "Revision Comments (from Question Writer)",
                              "Subdomain", "Writer's Difficulty Estimate", "Extra Revised Question",
                              "Extra Revised Explanation", "Extra Revised Correct Answer",
                              "Extra Revised Incorrect Answer 1", "Extra Revised Incorrect Answer 2",
                              "Extra Revised Incorrect Answer 3")],
    ("Non-Expert Validator Accuracy", "float64"), ("Majority Non-Expert Vals Incorrect", "float64"),
    ("Expert Validator Accuracy", "float64"), ("Record ID", "string"), ("High-level domain", "string"),
    ("Question Writer", "string"),
    *[col for n in (1, 2) for col in (
        (f"Feedback_EV_{n}", "string"), (f"Validator Revision Suggestion_EV_{n}", "string"),
        (f"Is First Validation_EV_{n}", "bool"), (f"Post hoc agreement_EV_{n}", "string"),
        (f"Sufficient Expertise?_EV_{n}", "string"), (f"Understand the question?_EV_{n}", "string"),
        (f"Question Difficulty_EV_{n}", "string"), (f"Validator Answered Correctly_EV_{n}", "int64"),
        (f"Self-reported time (minutes)_EV_{n}", "float64"), (f"Probability Correct_EV_{n}", "string"),
        (f"Manual Correctness Adjustment_EV_{n}", "string"), (f"Expert Validator_EV_{n}", "string"))],
    *[col for n in (1, 2, 3) for col in (
        (f"Feedback_NEV_{n}", "string"), (f"Validator Answered Correctly_NEV_{n}", "int64"),
        (f"Explanation_NEV_{n}", "string"), (f"Self-reported time (minutes)_NEV_{n}", "float64"),
        (f"Websites visited_NEV_{n}", "string"), (f"Probability Correct_NEV_{n}", "string"),
        (f"Manual Correctness Adjustment_NEV_{n}", "null"), (f"Non-Expert Validator_NEV_{n}", "string"))],
    ("Expert Validator Disagreement Category", "float64"), ("Canary String", "string"),
]
GPQA_ROWS = {
    "gpqa_diamond": [
        ("A sealed rigid flask of ideal gas is warmed from 300 K to 600 K. By what factor does its pressure change?",
         "It doubles.", "It halves.", "It stays the same.", "It quadruples.", "Physics", "Thermodynamics"),
        ("Which organelle of a plant cell carries out photosynthesis?", "The chloroplast.", "The ribosome.",
         "The nucleolus.", "The lysosome.", "Biology", "Cell Biology")],
    "gpqa_extended": [
        ("How many moles of water form when two moles of hydrogen gas burn completely in oxygen?", "2 mol",
         "1 mol", "4 mol", "0.5 mol", "Chemistry", "Chemistry (general)"),
        ("A lens of focal length 10 cm images an object 20 cm in front of it. Where is the image?",
         "20 cm behind the lens", "10 cm behind the lens", "40 cm behind the lens", "20 cm in front of the lens",
         "Physics", "Optics")],
    "gpqa_main": [
        ("Which base pairs with adenine in DNA?", "Thymine", "Uracil", "Cytosine", "Guanine", "Biology",
         "Molecular Biology"),
        ("What is the oxidation state of manganese in permanganate, MnO4-?", "+7", "+4", "+2", "+6", "Chemistry",
         "Inorganic Chemistry")],
}

MATH_CONFIGS = ("algebra", "counting_and_probability", "geometry", "intermediate_algebra", "number_theory",
                "prealgebra", "precalculus")
MATH_TYPES = {"algebra": "Algebra", "counting_and_probability": "Counting & Probability", "geometry": "Geometry",
              "intermediate_algebra": "Intermediate Algebra", "number_theory": "Number Theory",
              "prealgebra": "Prealgebra", "precalculus": "Precalculus"}

MUSR = {
    "murder_mysteries": [
        ("In the quiet town of Fenwick, the curator was found in the archive at dawn. Ada had a key to the archive "
         "and argued with the curator the night before. Bram was seen at the harbor all night by two sailors.",
         "Who is the most likely murderer?", ["Ada", "Bram"], 0),
        ("At the lighthouse dinner, the keeper collapsed after the toast. Cleo poured the wine; Dario had left "
         "before the toast to fetch the boat.", "Who is the most likely murderer?", ["Cleo", "Dario"], 0)],
    "object_placements": [
        ("Maya put her notebook on the kitchen table and went out. While she was away, Leo moved the notebook to "
         "the bookshelf to make room for dinner. Maya did not see this.",
         "Which location is the most likely place Maya would look to find the notebook given the story?",
         ["kitchen table", "bookshelf", "bedroom"], 0),
        ("Sam left the keys in the blue bowl. Ria moved them to the drawer while Sam watched.",
         "Which location is the most likely place Sam would look to find the keys given the story?",
         ["blue bowl", "drawer", "car"], 1)],
    "team_allocation": [
        ("A bakery must staff the oven and the counter. Ivy burns bread but charms customers. Tom bakes well but "
         "is shy. Uma is decent at both but argues with Tom.",
         "Given the story, how would you uniquely allocate each person to make sure both tasks are accomplished "
         "efficiently?", ["Oven: Tom, Counter: Ivy and Uma", "Oven: Ivy, Counter: Tom and Uma",
                          "Oven: Uma, Counter: Ivy and Tom"], 0),
        ("A ship needs a navigator and two deckhands. Pia reads charts well. Ned and Ola are strong but get "
         "lost easily.", "Given the story, how would you uniquely allocate each person to make sure both tasks "
         "are accomplished efficiently?", ["Navigator: Ned, Deck: Pia and Ola", "Navigator: Pia, Deck: Ned and "
                                           "Ola", "Navigator: Ola, Deck: Pia and Ned"], 1)],
}

# IFEval's kwargs: one struct per instruction, every field any instruction takes (null where it takes none).
IFEVAL_KWARGS: list[tuple[str, str]] = [
    ("num_highlights", "int64"), ("relation", "string"), ("num_words", "int64"), ("num_placeholders", "int64"),
    ("prompt_to_repeat", "string"), ("num_bullets", "int64"), ("section_spliter", "string"),
    ("num_sections", "int64"), ("capital_relation", "string"), ("capital_frequency", "int64"),
    ("keywords", "list"), ("num_paragraphs", "int64"), ("language", "string"), ("let_relation", "string"),
    ("letter", "string"), ("let_frequency", "int64"), ("end_phrase", "string"), ("forbidden_words", "list"),
    ("keyword", "string"), ("frequency", "int64"), ("num_sentences", "int64"), ("postscript_marker", "string"),
    ("first_word", "string"), ("nth_paragraph", "int64"),
]
IFEVAL_ROWS = [
    (1001, "Describe a walk along a river at sunset in two sentences. Your ENTIRE response should be in English "
           "language, no other language is allowed. Do not use any commas in your response.",
     ["language:response_language", "punctuation:no_comma"], [{"language": "en"}, {}]),
    (1002, "Write a short note to a neighbour about a lost cat. Use fewer than 3 sentences and highlight at least "
           "1 section with markdown, i.e. *highlighted section*. Use words in all capital letters at least 2 times.",
     ["length_constraints:number_sentences", "detectable_format:number_highlighted_sections",
      "change_case:capital_word_frequency"],
     [{"num_sentences": 3, "relation": "less than"}, {"num_highlights": 1},
      {"capital_frequency": 2, "capital_relation": "at least"}]),
    (1003, "List three uses of a paperclip. Answer with at least 10 words and end your response with the exact "
           "phrase \"Is there anything else I can help with?\".",
     ["length_constraints:number_words", "startend:end_checker"],
     [{"num_words": 10, "relation": "at least"}, {"end_phrase": "Is there anything else I can help with?"}]),
]


def features(kind: str) -> Any:
    from datasets import Features, List, Value

    schemas = {
        "bbh": {"input": Value("string"), "target": Value("string")},
        "gpqa": {name: Value(dtype) for name, dtype in GPQA_COLUMNS},
        "math": {"problem": Value("string"), "level": Value("string"), "solution": Value("string"),
                 "type": Value("string")},
        "musr": {"narrative": Value("string"), "question": Value("string"), "choices": Value("string"),
                 "answer_index": Value("int64"), "answer_choice": Value("string")},
        "mmlu_pro": {"question_id": Value("int64"), "question": Value("string"), "options": List(Value("string")),
                     "answer": Value("string"), "answer_index": Value("int64"), "cot_content": Value("string"),
                     "category": Value("string"), "src": Value("string")},
        "ifeval": {"key": Value("int64"), "prompt": Value("string"), "instruction_id_list": List(Value("string")),
                   "kwargs": List({name: List(Value("string")) if dtype == "list" else Value(dtype)
                                   for name, dtype in IFEVAL_KWARGS})},
    }
    return Features(schemas[kind])


def gpqa_row(config: str, i: int, question: str, correct: str, wrong: tuple[str, str, str], domain: str,
             subdomain: str) -> dict[str, Any]:
    row: dict[str, Any] = {name: None for name, _ in GPQA_COLUMNS}
    explanation = f"Made-up explanation: the answer is {correct}"
    row.update({"Question": question, "Correct Answer": correct, "Incorrect Answer 1": wrong[0],
                "Incorrect Answer 2": wrong[1], "Incorrect Answer 3": wrong[2], "Explanation": explanation,
                "Pre-Revision Question": question, "Pre-Revision Correct Answer": correct,
                "Pre-Revision Incorrect Answer 1": wrong[0], "Pre-Revision Incorrect Answer 2": wrong[1],
                "Pre-Revision Incorrect Answer 3": wrong[2], "Pre-Revision Explanation": explanation,
                "Subdomain": subdomain, "High-level domain": domain, "Record ID": f"rec{config}{i}",
                "Self-reported question-writing time (minutes)": 20.0, "Expert Validator Accuracy": 1.0,
                "Non-Expert Validator Accuracy": 0.5, "Canary String": "raylm test mirror: made-up row"})
    return row


def math_rows(config: str) -> dict[str, list[dict[str, str]]]:
    """Per config, test: two Level 5 problems (the hard subset) and one of Level 3 (which lm-eval filters out);
    train: one problem."""
    kind = MATH_TYPES[config]
    n = len(config)

    def row(level: int, a: int, b: int) -> dict[str, str]:
        return {"problem": f"In a made-up {kind.lower()} exercise, what is ${a} \\cdot {b} + {n}$?",
                "level": f"Level {level}", "type": kind,
                "solution": f"We compute ${a} \\cdot {b} = {a * b}$, so the sum is $\\boxed{{{a * b + n}}}$."}

    return {"train": [row(2, 2, n)], "test": [row(5, 3, n), row(3, 4, 5), row(5, n, 7)]}


def mmlu_pro_rows() -> dict[str, list[dict[str, Any]]]:
    subjects = [("math", "What is 6 times 7?", ["36", "42", "48", "56"], 1),
                ("physics", "Which unit measures force?", ["joule", "watt", "newton", "pascal"], 2),
                ("biology", "Which molecule carries genetic information?", ["DNA", "ATP", "glucose", "lipid"], 0),
                ("history", "Which came first?", ["the printing press", "the telephone", "the airplane",
                                                  "the radio"], 0),
                ("law", "A contract needs offer, acceptance and what else?", ["a witness", "consideration",
                                                                              "a notary", "a lawyer"], 1),
                ("economics", "When supply rises and demand stays, price tends to", ["rise", "fall", "stay",
                                                                                      "double"], 1),
                ("chemistry", "What is the chemical symbol of sodium?", ["S", "So", "Na", "Sd"], 2)]
    rows = []
    for i, (category, question, options, answer) in enumerate(subjects):
        letter = "ABCDEFGHIJ"[answer]
        rows.append({"question_id": 70 + i, "question": question, "options": options, "answer": letter,
                     "answer_index": answer, "category": category, "src": f"made-up-{category}",
                     "cot_content": f"A: Let's think step by step. The answer is ({letter})."})
    for row in rows[5:]:
        row["cot_content"] = ""  # the test split's rows carry no chain of thought
    return {"validation": rows[:5], "test": rows[5:]}


def datasets() -> dict[tuple[str, str], tuple[str, dict[str, list[dict[str, Any]]]]]:
    """(hub name, config) -> (schema kind, {split: rows})."""
    out: dict[tuple[str, str], tuple[str, dict[str, list[dict[str, Any]]]]] = {}
    for task, rows in BBH.items():
        out[("SaylorTwift/bbh", task)] = ("bbh", {"test": [{"input": i, "target": t} for i, t in rows]})
    for config, rows in GPQA_ROWS.items():
        out[("Idavidrein/gpqa", config)] = ("gpqa", {"train": [
            gpqa_row(config, i, q, c, (w1, w2, w3), d, s) for i, (q, c, w1, w2, w3, d, s) in enumerate(rows)]})
    for config in MATH_CONFIGS:
        out[("DigitalLearningGmbH/MATH-lighteval", config)] = ("math", math_rows(config))
    out[("TAUR-Lab/MuSR", "default")] = ("musr", {split: [
        {"narrative": n, "question": q, "choices": repr(c), "answer_index": a, "answer_choice": c[a]}
        for n, q, c, a in rows] for split, rows in MUSR.items()})
    out[("TIGER-Lab/MMLU-Pro", "default")] = ("mmlu_pro", mmlu_pro_rows())
    out[("wis-k/instruction-following-eval", "default")] = ("ifeval", {"train": [
        {"key": k, "prompt": p, "instruction_id_list": ids, "kwargs": kwargs} for k, p, ids, kwargs in IFEVAL_ROWS]})
    return out


def write_cached(cache: Path, repo: str, config: str, kind: str, splits: dict[str, list[dict[str, Any]]]) -> Path:
    """One config of `repo` as `datasets` caches a dataset it has prepared."""
    from datasets import Dataset, DatasetInfo, SplitDict, SplitInfo
    from datasets.arrow_writer import ArrowWriter
    from datasets.naming import camelcase_to_snakecase

    namespace, name = repo.split("/")
    snake = camelcase_to_snakecase(name)
    folder = cache / f"{namespace}___{snake}" / config / "0.0.0" / CACHE_HASH
    folder.mkdir(parents=True, exist_ok=True)
    schema = features(kind)
    split_dict = SplitDict(dataset_name=snake)
    for split, rows in splits.items():
        table = Dataset.from_list(rows, features=schema).data.table
        with ArrowWriter(path=str(folder / f"{snake}-{split}.arrow"), features=schema) as writer:
            writer.write_table(table)
            examples, size = writer.finalize()
        split_dict.add(SplitInfo(name=split, num_bytes=size, num_examples=examples, dataset_name=snake))
    DatasetInfo(features=schema, config_name=config, dataset_name=snake, splits=split_dict,
                description="raylm's test mirror: made-up rows in the dataset's schema").write_to_directory(
        str(folder))
    return folder


def write_punkt_tab(nltk_data: Path) -> Path:
    """An untrained English punkt_tab (test-only): nltk's four parameter files, empty."""
    folder = nltk_data / "tokenizers" / "punkt_tab" / "english"
    folder.mkdir(parents=True, exist_ok=True)
    for name in PUNKT_FILES:
        (folder / name).write_text("")
    return nltk_data


def write_mirror(out: Path) -> tuple[Path, Path]:
    """The datasets cache and the nltk data under `out`: (HF_DATASETS_CACHE, NLTK_DATA)."""
    cache = out / "hf-datasets"
    for (repo, config), (kind, splits) in datasets().items():
        write_cached(cache, repo, config, kind, splits)
    return cache, write_punkt_tab(out / "nltk_data")


if __name__ == "__main__":
    print("\n".join(map(str, write_mirror(Path(sys.argv[1]).resolve()))))
