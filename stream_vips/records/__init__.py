"""Record validation shared by the model families: JSON decoding, reason codes, numeric fields.

A record that fails a check is rejected with one reason code (:mod:`.reasons`) and a detail;
raw records are decoded as JSON one document or one batch at a time (:mod:`.decoding`), their
numeric fields validated a whole batch at a time (:class:`~.fields.FieldBatch`), and whole data
sets given as arrays or DataFrames read into float arrays (:mod:`.tabular`). Every public name
is importable from here.
"""

from __future__ import annotations

from stream_vips.records.decoding import Decoded as Decoded
from stream_vips.records.decoding import RawRecord as RawRecord
from stream_vips.records.decoding import decode_json as decode_json
from stream_vips.records.decoding import decode_one as decode_one
from stream_vips.records.decoding import undecoded as undecoded
from stream_vips.records.fields import FieldBatch as FieldBatch
from stream_vips.records.reasons import EMPTY_DOCUMENT as EMPTY_DOCUMENT
from stream_vips.records.reasons import INVALID_JSON as INVALID_JSON
from stream_vips.records.reasons import MISSING_FIELD as MISSING_FIELD
from stream_vips.records.reasons import NON_FINITE as NON_FINITE
from stream_vips.records.reasons import NOT_OBJECT as NOT_OBJECT
from stream_vips.records.reasons import OUT_OF_RANGE as OUT_OF_RANGE
from stream_vips.records.reasons import REASONS as REASONS
from stream_vips.records.reasons import TOMBSTONE as TOMBSTONE
from stream_vips.records.reasons import TOO_LARGE as TOO_LARGE
from stream_vips.records.reasons import WRONG_SHAPE as WRONG_SHAPE
from stream_vips.records.reasons import WRONG_TYPE as WRONG_TYPE
from stream_vips.records.reasons import RecordRejected as RecordRejected
from stream_vips.records.reasons import top_reasons as top_reasons
from stream_vips.records.tabular import DataFrameLike as DataFrameLike
from stream_vips.records.tabular import DataSet as DataSet
from stream_vips.records.tabular import as_floats as as_floats
from stream_vips.records.tabular import tabular as tabular
