"""The applier's options (``lake.applier.options``): built in code, they have the defaults of a
config file that leaves the keys out."""

from __future__ import annotations

from cdc_platform.config import parse_settings
from cdc_platform.lake.applier.options import ApplierOptions


def test_options_built_without_a_config_have_the_defaults_of_a_config_that_omits_the_keys(
) -> None:
    """The defaults are the settings schema's: options built in code (tests, the bench) run
    the applier as a config file leaving those keys out does."""
    settings = parse_settings({
        "source": {"flavour": "mariadb", "host": "db", "user": "u", "server_id": 7,
                   "server_name": "shop"},
        "landing_zone": {"url": "/l"}, "warehouse": {"url": "/w"}})
    from_config = ApplierOptions.from_settings(settings)
    in_code = ApplierOptions(
        server_name=from_config.server_name, flavour=from_config.flavour,
        landing_url=from_config.landing_url, warehouse_url=from_config.warehouse_url,
        catalog=from_config.catalog, connection=from_config.connection,
        selector=from_config.selector, s3=from_config.s3)
    assert in_code == from_config
