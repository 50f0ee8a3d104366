"""Terminal views shared by the CLI and notebooks: number formatting (``fmt``), the
reference table (``references``)."""
