# Fills the @@NAME@@ placeholders of deploy/gcp/*.json with jq's named arguments of the same name in lower
# case (@@CONTROLLER@@ from --arg controller ..., @@STARTUP_SCRIPT@@ from --rawfile startup_script ...); a
# placeholder without its argument is an error, so nothing half-filled reaches the API (docs/gcp.md, step 4).
def fill:
  if type == "string" then
    gsub("@@(?<name>[A-Z_]+)@@"; (.name | ascii_downcase) as $n
      | $ARGS.named[$n] // error("no --arg or --rawfile \($n) for @@\(.name)@@"))
  else . end;
walk(fill)
