#include <gtest/gtest.h>
TEST(EmulatorChecks, Placeholder) {}
