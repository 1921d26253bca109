"""Between generations: the stage a rank keeps in memory and the exchange that moves it to its new owners, the
hand-off of a leaving node's layers, the checkpoint a generation resumes from, and the salvage of a step held
after a lost peer."""
