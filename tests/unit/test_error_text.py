"""TensorFlow's own words from an op error (runtime/console.py
op_error_text), past its framing and past a "From /job:...:" line, which
says where, not what: a damaged checkpoint's warning gave that line alone
as its reason."""
import tensorflow as tf

from autopar.runtime.console import error_line, op_error_text
from autopar.runtime.checkpoint import _reason

MESSAGE = ("Graph execution error:\n\nDetected at node 'autopar/checkpoint/RestoreV2' defined at "
           "(most recent call last):\n  File \"train.py\", line 3, in <module>\n"
           "From /job:worker/replica:0/task:0:\nfile is too short to be an sstable\n"
           "\t [[{{node autopar/checkpoint/RestoreV2}}]]")


def test_a_where_line_is_followed_by_what_it_introduces():
    error = tf.errors.DataLossError(None, None, MESSAGE)
    words = "From /job:worker/replica:0/task:0: file is too short to be an sstable"
    assert op_error_text(error) == words
    assert _reason(error) == words           # a damaged checkpoint's warning
    assert error_line(error) == f"DataLossError: {words}"


def test_an_error_without_words_is_named_by_its_type():
    error = tf.errors.OpError(None, None, "", tf.errors.UNKNOWN)
    assert op_error_text(error) == "" and _reason(error) == "OpError"
