"""What a run hands to people and to other tools: its pairs exported in TRL's format with a
dataset card (`export`, behind `selskill.export_pairs` and `selskill export-pairs`) and the
notebook's HTML views of pairs (`pair_html`).

Both read a round's stages through `selskill.data` and mask a pair as training does
(`selskill.train.pairs`), so what a person inspects is what the trainer sees.
"""
