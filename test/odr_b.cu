// test/odr_b.cu: one of the two translation units of odr_test (see odr.hpp). odr_a.cu expands
// the same macro for unit a: another formula, and a kernel of the same name.
#include "odr.hpp"

ODR_TRANSLATION_UNIT(b)
