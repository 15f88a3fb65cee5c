"""One module per model family (its plans and recipe), the registry of plain-data rows, and validation from configs."""
