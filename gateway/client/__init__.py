"""Client libraries for the Figg and Tank protocols (trio, with blocking facades)."""
