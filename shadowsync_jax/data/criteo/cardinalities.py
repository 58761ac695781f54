"""The table sizes of Criteo's two datasets, as the reference DLRM models use them (`data.cardinalities`).

cardinalities.KAGGLE      # 33.8M rows: 2.2 GB of float32 at width 16
cardinalities.TERABYTE    # 204M rows: 13 GB at width 16, 105 GB at 128
cardinalities.capped(cardinalities.KAGGLE, 100_000)
"""

# Distinct values of C1..C26 in Kaggle's train.txt, the DLRM reference's table sizes (33.8M rows in all).
KAGGLE = (
  1460,
  583,
  10131227,
  2202608,
  305,
  24,
  12517,
  633,
  3,
  93145,
  5683,
  8351593,
  3194,
  27,
  14992,
  5461306,
  10,
  5652,
  2173,
  4,
  7046547,
  18,
  15,
  286181,
  105,
  142572,
)


# MLPerf DLRM-DCNv2's table sizes: the Terabyte features' distinct counts, capped at 40M rows by hashing.
TERABYTE = (
  40_000_000,
  39_060,
  17_295,
  7_424,
  20_265,
  3,
  7_122,
  1_543,
  63,
  40_000_000,
  3_067_956,
  405_282,
  10,
  2_209,
  11_938,
  155,
  4,
  976,
  14,
  40_000_000,
  40_000_000,
  40_000_000,
  590_152,
  12_973,
  108,
  36,
)


def capped(cardinalities: tuple[int, ...], cap: int) -> tuple[int, ...]:
  """Every table at most `cap` rows (ids hashed into them)."""
  return tuple(min(int(c), cap) for c in cardinalities)
