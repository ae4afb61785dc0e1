"""Answers: a prompt from `ragkit.retrieve` -> generation -> the answer checked against its
sources. `ask.py` (the three outcomes), `chat.py` (a conversation over one KV cache),
`citations.py` (the model's [n] markers), `claims.py` (each claim tied to the source
sentence that supports it), `passages.py` (the passages shown when an answer cannot be
verified, and quoted answers). How a source's text is read (sentences, words, quotes,
similarity, figures) is the evidence floor's: ragkit.evidence.

    from ragkit.answer.ask import ask
    from ragkit.session import Session
    ask("Which law governs?", Session(settings), docs=["nda.pdf"])

(The submodules keep their names here: `ragkit.answer.ask` is the module, not the function.)
"""
