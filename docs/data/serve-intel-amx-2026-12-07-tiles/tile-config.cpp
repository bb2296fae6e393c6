#include <immintrin.h>
#include <stdint.h>
struct tile_config_t{ uint8_t palette_id = 0; uint8_t start_row = 0; uint8_t reserved_0[14] = {0}; uint16_t colsb[16] = {0}; uint8_t rows[16] = {0}; };
void init() {
    alignas(64) tile_config_t tc = {};
    tc.palette_id = 1;
    tc.rows[0] = 8;   tc.colsb[0] = 64;
    tc.rows[4] = 16;  tc.colsb[4] = 64;
    _tile_loadconfig(&tc);
}
