"""How meshdit's bundled model was made and is scored: not run-time code, so not part of the installed
`meshdit` package (run from the repository root).

    components.py   the model's parts built in code (tokenizers with their learnt vocabulary, encoders, VAE, DiT)
    dataset.py      the procedural captioned-shapes images and the held-out prompts
    train.py        `python -m default_model.train`: trains the model and saves a FluxPipeline folder
    evaluate.py     `python -m default_model.evaluate`: scores images against their prompts from the pixels

The trained weights and the settings `meshdit generate` uses with them stay in `meshdit/default_model/`.
"""
