"""The evidence floor: the text of a source as every later step reads it.

A document's units (sentences, list items read with their lead-in, numbered clauses, table
rows under their column headers) with their character offsets; the one `words()`; quote
choice; similarity; figure reading; location formatting. Retrieval packs its prompt from
these units, the answer's checks and the checklist's quotes read the same ones, so a quote
is never a chunk fragment. It sits above the store and below retrieve, answer and compare,
and imports none of them (.importlinter: evidence-below-retrieval).

    sentences.py    the one sentence splitter: sentences, list items, table rows, spans
    spans.py        units with their character offsets, and the clause around one
    words.py        words() (stemmed, as the lexical index reads them), content_words,
                    name_words, plain_words
    quotes.py       quote choice: clause_quote, with_lead_in, quotable, is_heading
    similarity.py   cosines calibrated against sentences about nothing (ANCHORS)
    figures.py      numbers, amounts, periods, dates and table cells; unsupported_figures
    location.py     format_location: "p. 3, § 5.2 Term"

Each module is imported by its own name (`from ragkit.evidence.words import words`): this
package imports nothing, so reading one rule loads no other.
"""
