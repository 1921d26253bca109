# Makes the on-demand pool's bodies (docs/gcp.md, "On-demand capacity") from the Spot ones render.jq filled in:
# one source for what the two pools share. Takes --arg group NAME, the on-demand group's name. The template loses
# its Spot scheduling and asks for the on-demand group's identity audience; the group uses that template.
if has("properties") then
  .name += "-on-demand"
  | .description = "spotmorph's GPU on-demand VMs (docs/gcp.md, On-demand capacity): the Spot template without Spot."
  | .properties.scheduling = {"provisioningModel": "STANDARD", "onHostMaintenance": "TERMINATE", "automaticRestart": true}
  | .properties.labels.spotmorph = "worker-on-demand"
  | .properties.metadata.items |= map(if .key == "spotmorph-audience" then .value |= sub("/[^/]+$"; "/" + $group) else . end)
else
  .name = $group
  | .description = "spotmorph's on-demand VMs (docs/gcp.md): the controller sizes this group only when a deadline is at risk."
  | .baseInstanceName += "-od"
  | .instanceTemplate += "-on-demand"
end
