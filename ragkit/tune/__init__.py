"""Training the models ragkit ships from labelled documents (`ragkit tune`): the checklist's
label model (`ragkit.tune.checklist`). Above the pipeline: it ingests, retrieves and labels
with the product's own code, so what a model is trained on is what it sees in `compare`.
Imports torch and sentence-transformers only when a training starts."""
