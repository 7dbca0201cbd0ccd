"""Landing files as lines: text, file name and line number, exactly as delivered.

Spark's text reader has no line numbers, so files are read as bytes (`binaryFile`) and
split here. Spark's `split` decodes text (invalid UTF-8 becomes U+FFFD), so files that are
not valid UTF-8 are split at the byte level instead, and each bad line keeps its bytes.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

LINES_SCHEMA = T.StructType(
    [
        T.StructField("day", T.DateType()),
        T.StructField("file_name", T.StringType()),
        T.StructField("_source_path", T.StringType()),
        T.StructField("line_number", T.IntegerType()),
        T.StructField("line", T.StringType()),
        T.StructField("line_bytes", T.BinaryType()),
        T.StructField("is_blank", T.BooleanType()),
    ]
)

# A line in hex: whole bytes (lazily) up to a newline byte that starts on a byte boundary.
_HEX_LINE = r"((?:[0-9A-F]{2})*?)0A"


def read_lines(spark: SparkSession, files: Sequence[object], day_folder: str) -> DataFrame:
    """One row per line of `files` (local paths or URIs, as `str()` spells them); `day`
    comes from the `<day_folder>=YYYY-MM-DD` folder.

    A UTF-8 byte order mark opening a file and a `\\r` ending a line are not part of the
    line; the empty piece after a final newline is not a line. Blank lines are kept here
    (flagged) so callers can count them; they never become table rows.
    """
    if not files:
        return spark.createDataFrame([], LINES_SCHEMA)
    content = spark.read.format("binaryFile").load([str(f) for f in files])
    files_df = content.select(
        F.to_date(F.regexp_extract("path", rf"{day_folder}=(\d{{4}}-\d{{2}}-\d{{2}})/", 1)).alias(
            "day"
        ),
        F.element_at(F.split("path", "/"), -1).alias("file_name"),
        F.col("path").alias("_source_path"),
        "content",
        F.is_valid_utf8(F.col("content").cast("string")).alias("valid_utf8"),
    )
    text_pieces = (
        files_df.where("valid_utf8")
        .withColumn("_split", F.split(F.col("content").cast("string"), "\n"))
        .select(
            "day",
            "file_name",
            "_source_path",
            F.posexplode("_split").alias("pos", "piece"),
            F.size("_split").alias("pieces"),
        )
        .where(~((F.col("pos") == F.col("pieces") - 1) & (F.col("piece") == "")))
        .drop("pieces")
    )
    # The hex path never leaves a trailing empty piece: a final newline ends the last match.
    hex_text = F.hex("content")
    byte_pieces = (
        files_df.where("NOT valid_utf8")
        .select(
            "day",
            "file_name",
            "_source_path",
            F.posexplode(
                F.regexp_extract_all(
                    F.when(hex_text.endswith("0A"), hex_text).otherwise(
                        F.concat(hex_text, F.lit("0A"))
                    ),
                    F.lit(_HEX_LINE),
                    1,
                )
            ).alias("pos", "hex_piece"),
        )
        .select(
            "day",
            "file_name",
            "_source_path",
            "pos",
            F.unhex("hex_piece").cast("string").alias("piece"),
        )
    )
    pieces = text_pieces.unionByName(byte_pieces)
    valid = F.is_valid_utf8("piece")
    text = F.regexp_replace(
        F.when(F.col("pos") == 0, F.regexp_replace("piece", "^\ufeff", "")).otherwise(
            F.col("piece")
        ),
        "\r$",
        "",
    )
    return pieces.select(
        "day",
        "file_name",
        "_source_path",
        (F.col("pos") + 1).cast("int").alias("line_number"),
        F.when(valid, text).otherwise(F.make_valid_utf8("piece")).alias("line"),
        F.when(~valid, F.col("piece").cast("binary")).alias("line_bytes"),
        _is_blank(text).alias("is_blank"),
    )


def counted(lines: DataFrame, name: str) -> tuple[DataFrame, Observation]:
    """`lines` counted as they are read (non-blank `rows`, `blank_lines_skipped`), with the
    `Observation` that holds the counts once an action has used the lines.

    The observation also ends the code Spark generates for the line split, so a parse after
    it compiles to a method of its own. As one method, the split and the contract's parse
    were 8,124-8,534 bytes of bytecode, over HotSpot's 8,000-byte limit for compiling a
    method, and ran interpreted (docs/performance.md).
    """
    observation = Observation(name)
    blank = F.col("is_blank")
    observed = lines.observe(
        observation,
        F.count(F.when(~blank, True)).alias("rows"),
        F.count(F.when(blank, True)).alias("blank_lines_skipped"),
    )
    return observed, observation


def _is_blank(text: Column) -> Column:
    return F.regexp_like(text, F.lit(r"^[ \t]*$"))
