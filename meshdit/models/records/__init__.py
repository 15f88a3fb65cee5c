"""One module per transformer class (or pipeline variant with its own recipe), each holding `RECORD`, a
`models.record.ModelFamily`: torch-free, so validation and `meshdit plan` read them before any rank starts.
`models/registry.py` lists this package: a new family's record is found without editing any list."""
