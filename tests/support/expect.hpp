// A check's failure in the attendee's words only. EXPECT_TRUE(check) makes GoogleTest print the
// check's source ("Value of: labtest::on_every_rank(...)", which may hold the expected answer, a
// golden schedule string) and "Actual: false"; ADD_FAILURE() prints "Failed". These report the
// message alone, at the caller's line (the test main adds the file and line after it).
#pragma once

#include <gtest/gtest.h>

/// A failure whose message is only what is streamed into it: ADD_FAILURE() without its "Failed".
#define LABTEST_FAIL() GTEST_NONFATAL_FAILURE_("")

/// `result` (a testing::AssertionResult) checked: on failure, `what` (a name for what was
/// compared, may be "") then its explanation.
#define LABTEST_EXPECT(result, what)                                      \
  do {                                                                    \
    const ::testing::AssertionResult labtest_result_ = (result);          \
    if (!labtest_result_) LABTEST_FAIL() << what << labtest_result_.message(); \
  } while (0)
