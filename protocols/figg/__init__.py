"""Figg: message declarations (``specs/``), records (:mod:`.messages`) and the sans-IO
connection with the fast DATA encoders (:mod:`.connection`)."""
